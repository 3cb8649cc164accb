"""Self-test of the block parser and the output comparison (CTest: docs:parser)."""
import pathlib
import sys
import unittest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import blocks as B  # noqa: E402
from run_block import same_output  # noqa: E402

CONTEXTS = pathlib.Path(__file__).resolve().parent / "contexts"
PAGE = '''# t
```{.cpp .program #p}
//~ #include <iostream>
int main() { std::cout << 1; }
```

```{.text .output for="p" tolerance="1e-6"}
1
```

=== "Tab"

    ```{.cpp .fragment #f context="engine"}
    CHECK(true);
    ```

````markdown
```cpp
not a C++ block: inside a markdown example
```
````
'''


class ParserTest(unittest.TestCase):
    def test_kinds_ids_lines(self):
        blocks = B.parse_text(PAGE, "docs/t.md")
        cpp = [b for b in blocks if b.is_cpp]
        self.assertEqual([(b.kind, b.id, b.line) for b in cpp], [("program", "p", 2), ("fragment", "f", 13)])
        self.assertEqual(cpp[0].compiled_lines()[0], "#include <iostream>")
        self.assertEqual(cpp[0].shown_lines(), ["int main() { std::cout << 1; }"])
        self.assertEqual(cpp[1].lines, ["CHECK(true);"])
        self.assertEqual(B.output_of(blocks, "p").attrs["tolerance"], "1e-6")
        self.assertEqual(B.check_page(blocks, CONTEXTS), [])

    def test_errors(self):
        cases = {
            "```cpp\nint x;\n```\n": "exactly one kind",
            "```{.cpp .program}\nint main(){}\n```\n": "needs an id",
            '```{.cpp .fragment #a context="nope"}\n```\n': "no file snippets/contexts/nope.h",
            "```{.cpp .compile-fail #a}\n```\n": "needs expect=",
            "```{.cpp .no-compile #a}\n```\n": "needs reason=",
            '```{.cpp .program #a colour="red"}\n```\n': "unknown attribute",
            "```cpp title=x.cpp\n```\n": "bare key=value",
            '```{.text .output for="zz"}\n```\n': "no runnable C++ block",
            "```{.cpp .program #a}\nint main(){}\n": "unclosed fence",
        }
        for text, expected in cases.items():
            messages = " | ".join(m for _, m in B.check_page(B.parse_text(text, "docs/t.md"), CONTEXTS))
            self.assertIn(expected, messages, text)

    def test_same_output(self):
        self.assertTrue(same_output("a 1.0\n", "a 1.0\n", ""))
        self.assertFalse(same_output("a 1.0\n", "a 1.0000001\n", ""))
        self.assertTrue(same_output("lr 0.001 x\n", "lr 0.0010000001 x\n", "1e-6"))
        self.assertFalse(same_output("lr 0.001 x\n", "lr 0.0011 x\n", "1e-6"))
        self.assertFalse(same_output("lr 0.001 x\n", "lr 0.001 y\n", "1e-6"))


if __name__ == "__main__":
    unittest.main()
