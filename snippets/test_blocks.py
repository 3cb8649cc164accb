"""Self-test of the block parser and the output comparison (CTest: docs:parser)."""
import pathlib
import sys
import unittest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import blocks as B  # noqa: E402
import plot  # noqa: E402
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
            "```{.cpp .program #a}\n#include <stepwise/stepwise.h>\n#include <torch/torch.h>\n```\n":
                "after another include: write it first",
            "```{.cpp .program #a}\nauto m = torch::nn::Sequential(torch::nn::Linear(4, 8),\n"
            "    torch::nn::ReLU(), torch::nn::Linear(8, 1));\n```\n":
                "torch::nn::Sequential(...) draws from the random generator in 2 of its arguments",
            '```{.cpp .program #a plot="bars"}\n```\n': "unknown attribute",
            '```{.text .output for="p" plot="bars"}\n```\n': "the plot kinds are",
        }
        for text, expected in cases.items():
            messages = " | ".join(m for _, m in B.check_page(B.parse_text(text, "docs/t.md"), CONTEXTS))
            self.assertIn(expected, messages, text)

    def test_evaluation_order(self):
        # Unsequenced: a call's arguments. Sequenced: statements, declarators, braced lists,
        # the object of a member call and its arguments.
        order = B.order_dependent_calls
        drawing = {
            "auto l = torch::mse_loss(model(torch::randn({2, 4})), torch::randn({2, 1}));":
                "torch::mse_loss",
            "torch::nn::Sequential m(torch::nn::Linear(4, 8), torch::nn::Linear(8, 1));": "m",
            "auto n = std::make_shared<Net>(torch::nn::Linear(4, 8), torch::nn::Linear(8, 1));":
                "std::make_shared",
            "torch::nn::Sequential s(torch::nn::Conv2d(1, 2, 3), torch::nn::Embedding(4, 2));": "s",
            "h(torch::nn::LSTMCell(2, 3), x.uniform_(0, 1));": "h",
            "g(torch::randn({1}) /* Linear( */, torch::randn({1}));": "g",
        }
        for line, callee in drawing.items():
            self.assertEqual(order([line]), [(callee, 2)], line)
        # A digit separator or a raw string with a lone quote hides nothing after it.
        for before in ("int64_t n = 1'000;", 'auto c = R"({"say": "hi)";'):
            self.assertEqual(order([before, "f(torch::randn({2}), torch::rand({2}));"]), [("f", 2)])
        for fine in (["torch::nn::Linear fc1(4, 8), fc2(8, 1);",
                      "torch::nn::Sequential m(fc1, torch::nn::ReLU(), fc2);"],
                     ["auto t = torch::cat({torch::randn({2}), torch::randn({2})});"],
                     ["auto x = torch::randn({2, 4}), y = torch::randn({2, 1});"],
                     ["auto x = torch::randn({2}).add(torch::randn({2}));"],
                     ["h(torch::nn::init::normal_(w), torch::nn::init::zeros_(b));"],
                     ['f("torch::randn(", torch::randn({1}));  // Linear(1, 2)']):
            self.assertEqual(order(fine), [], fine)
        # Hidden lines are compiled, so they are read too.
        page = ("```{.cpp .program #a}\n//~ auto l = torch::mse_loss(m(torch::randn({1})), "
                "torch::randn({1}));\nint main() {}\n```\n")
        messages = [m for _, m in B.check_page(B.parse_text(page, "docs/t.md"), CONTEXTS)]
        self.assertTrue(any("torch::mse_loss(...) draws" in m for m in messages), messages)

    def test_timeline(self):
        head = "   mb | loss   | backward() | boundary | step()   | micro | global | lr"
        rows = ["    1 | 0.4000 | 0.1000     | no       | counted  |     1 |      0 | 0.050",
                "    2 | 0.0010 | 0.0003     | yes      | the step |     2 |      1 | 0.100",
                "    3 | 0.2000 | 0.0000     | no       | counted  |     3 |      1 | 0.100",
                "flush |        |            |          | the step |     4 |      2 | 0.100"]
        svg = plot.timeline_chart([head] + rows)
        self.assertEqual((svg.count('class="sw-step"'), svg.count('class="sw-count"')), (2, 2))
        self.assertIn("loss / 4", svg)    # 0.4 / 0.1
        self.assertIn(">0.0003<", svg)    # too rounded to give a fraction: the value
        self.assertIn("window 2 (flushed)", svg)
        nothing = rows[:3] + ["flush |        |            |          | nothing  |     3 |      1 | 0.100"]
        svg = plot.timeline_chart([head] + nothing)
        self.assertEqual(svg.count('class="sw-step"'), 1)
        self.assertNotIn("(flushed)", svg)  # a flush() with nothing pending ends no window
        with self.assertRaisesRegex(ValueError, "header"):
            plot.timeline_chart(rows)

    def test_copy_text(self):
        program, fragment = [b for b in B.parse_text(PAGE, "docs/t.md") if b.is_cpp]
        # A program copies its whole source, the hidden include included.
        self.assertEqual(B.copy_text(program), "#include <iostream>\nint main() { std::cout << 1; }\n")
        # A fragment copies a complete program: its context, doctest's checks, a main().
        copy = B.copy_text(fragment)
        self.assertIn("struct engine_context {", copy)
        self.assertIn("struct Block : engine_context {\n  void run() {\n    CHECK(true);\n  }\n};", copy)
        self.assertIn("#define CHECK(...)", copy)
        self.assertIn("int main() {\n  Block().run();", copy)
        self.assertNotIn("doctest.h", copy)
        self.assertNotIn("#pragma once", copy)
        # No check used: the checks are not pasted in.
        plain = B.parse_text('```{.cpp .fragment #g context="basic"}\nint x = 1;\n```\n', "docs/t.md")[0]
        self.assertNotIn("CHECK", B.copy_text(plain))

    def test_header_blocks(self):
        header = pathlib.Path(__file__).resolve().parent.parent / "include" / "stepwise" / "engine.h"
        (block,) = B.header_blocks(header)
        self.assertEqual((block.kind, block.id, block.attrs["context"]), ("fragment", "engine", "loader"))
        self.assertTrue(block.lines[0].startswith("auto engine = stepwise::initialize("))
        self.assertEqual(header.read_text().splitlines()[block.first_code_line - 1], "//   " + block.lines[0])
        self.assertEqual(B.header_block_id("include/stepwise/cuda/kernels.h"), "cuda-kernels")

    def test_readme_matches_tested_block(self):
        import tempfile
        root = pathlib.Path(__file__).resolve().parent.parent
        self.assertEqual(B.check_readme(root / "README.md", root), [])
        with tempfile.TemporaryDirectory() as tmp:
            bad = pathlib.Path(tmp) / "README.md"
            bad.write_text("<!-- tested: docs/index.md#at-a-glance -->\n```cpp\nloader.drift();\n```\n")
            self.assertIn("differs from the code shown", B.check_readme(bad, root)[0][1])
            bad.write_text("```cpp\nint x;\n```\n")
            self.assertIn("without a `<!-- tested:", B.check_readme(bad, root)[0][1])

    def test_before_after_both_directions(self):
        from run_block import kept_or_replaced
        page = ('```{.cpp .program #b}\nint main() {\n  int x = 1;\n  x += 2;\n  // a note\n}\n```\n\n'
                '```{.cpp .program #a before="b"}\nint main() {\n  int x = 1;\n  // before: x += 2;\n}\n```\n')
        before, after = [b for b in B.parse_text(page, "docs/t.md") if b.is_cpp]
        self.assertEqual(kept_or_replaced(before, after), [])
        dropped = page.replace("  // before: x += 2;\n", "")
        before, after = [b for b in B.parse_text(dropped, "docs/t.md") if b.is_cpp]
        self.assertEqual(kept_or_replaced(before, after), [(4, "x += 2;")])

    def test_same_output(self):
        self.assertTrue(same_output("a 1.0\n", "a 1.0\n", ""))
        self.assertFalse(same_output("a 1.0\n", "a 1.0000001\n", ""))
        self.assertTrue(same_output("lr 0.001 x\n", "lr 0.0010000001 x\n", "1e-6"))
        # Relative, also below 1: an lr 10% off fails however small it is.
        self.assertFalse(same_output("lr 1e-05\n", "lr 1.1e-05\n", "1e-6"))
        self.assertFalse(same_output("w 0\n", "w 1e-07\n", "1e-6"))
        self.assertTrue(same_output("w 0\n", "w 1e-07\n", "1e-6", atol="1e-6"))
        self.assertFalse(same_output("w 0\n", "w 1e-05\n", "1e-6", atol="1e-6"))
        self.assertFalse(same_output("lr 0.001 x\n", "lr 0.0011 x\n", "1e-6"))
        self.assertFalse(same_output("lr 0.001 x\n", "lr 0.001 y\n", "1e-6"))


if __name__ == "__main__":
    unittest.main()
