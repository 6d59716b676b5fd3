// The inspector's little script: JSON blocks become collapsible trees when opened, and
// "expand all" opens every step's details. The pages work without it.
"use strict";

(function () {
  function node(tag, cls, text) {
    const el = document.createElement(tag);
    if (cls) el.className = cls;
    if (text !== undefined) el.textContent = text;
    return el;
  }

  function leaf(value) {
    if (value === null) return node("span", "l", "null");
    if (typeof value === "string") return node("span", "s", JSON.stringify(value));
    if (typeof value === "number") return node("span", "n", String(value));
    if (typeof value === "boolean") return node("span", "l", String(value));
    return node("span", "", String(value));
  }

  // One level at a time: a child object's rows are built when it is first opened, so a
  // large observation costs nothing until someone looks inside it.
  function tree(value, label, open) {
    if (value === null || typeof value !== "object") {
      const row = node("div", "row");
      if (label !== null) row.appendChild(node("span", "k", label + ": "));
      row.appendChild(leaf(value));
      return row;
    }
    const isArray = Array.isArray(value);
    const keys = isArray ? value.map(function (_, i) { return i; }) : Object.keys(value);
    const details = node("details");
    const summary = node("summary");
    if (label !== null) summary.appendChild(node("span", "k", label + ": "));
    summary.appendChild(node("span", "muted", isArray ? "[" + keys.length + "]" : "{" + keys.length + "}"));
    details.appendChild(summary);
    let built = false;
    function build() {
      if (built) return;
      built = true;
      keys.forEach(function (k) { details.appendChild(tree(value[k], String(k), false)); });
    }
    details.addEventListener("toggle", function () { if (details.open) build(); });
    if (open) { details.open = true; build(); }
    return details;
  }

  function treeify(block) {
    if (block.dataset.tree) return;
    block.dataset.tree = "1";
    const pre = block.querySelector("pre.json-text");
    if (!pre) return;
    let value;
    try {
      value = JSON.parse(pre.textContent);
    } catch (_) {
      return; // cut for length: the text stays as it is
    }
    if (value === null || typeof value !== "object") return;
    const holder = node("div", "json-tree");
    holder.appendChild(tree(value, null, true));
    pre.hidden = true;
    block.appendChild(holder);
  }

  document.addEventListener("toggle", function (event) {
    const target = event.target;
    if (target instanceof HTMLDetailsElement && target.classList.contains("json") && target.open) {
      treeify(target);
    }
  }, true);

  document.addEventListener("click", function (event) {
    const button = event.target;
    if (!(button instanceof HTMLButtonElement) || !button.classList.contains("toggle-all")) return;
    const open = button.dataset.open === "1";
    document.querySelectorAll("article.step details.transcript, article.step details.raw").forEach(function (d) {
      d.open = open;
    });
    button.dataset.open = open ? "0" : "1";
    button.textContent = open ? "collapse all" : "expand all";
  });
})();
