// Copy buttons of the docs' code blocks (loaded on every page, after Material's bundle).
//
// 1. A C++ block's copy button copies its complete program: the text of the "Complete
//    program" box that snippets/mkdocs_hook.py puts right after the block (a fragment's
//    context and main(), or a program's hidden lines). Material's copy handler (on the
//    body) copies data-clipboard-text when a button has it; it is set just before.
// 2. NOTE: [tall code blocks] Material 8.2.5 mounts a block's copy button only once the
//    block has been wholly visible (an IntersectionObserver with threshold 1), so a block
//    taller than the window never gets one. Every block gets a button of the same kind
//    here at load; when Material mounts its own, this one is removed.
document.addEventListener("click", (event) => {
  const button = event.target instanceof Element ? event.target.closest(".md-clipboard") : null;
  const block = button && button.closest('div.highlight[id^="snippet-"]');
  if (!block) return;
  const box = block.nextElementSibling;
  const code = box && box.matches("details.sw-complete") ? box.querySelector("code") : null;
  if (code) button.setAttribute("data-clipboard-text", code.textContent);
}, true);

(() => {
  let count = 0;
  for (const pre of document.querySelectorAll(".md-content .highlight > pre")) {
    if (!pre.querySelector(":scope > code") || pre.querySelector(":scope > button.md-clipboard")) continue;
    if (!pre.id) pre.id = `sw-code-${++count}`;
    const ours = document.createElement("button");
    ours.className = "md-clipboard md-icon sw-clipboard";
    ours.title = "Copy to clipboard";
    ours.setAttribute("data-clipboard-target", `#${pre.id} > code`);
    pre.insertBefore(ours, pre.firstChild);
    new MutationObserver((_, observer) => {
      if (pre.querySelector(":scope > button.md-clipboard:not(.sw-clipboard)")) {
        ours.remove();
        observer.disconnect();
      }
    }).observe(pre, { childList: true });
  }
})();
