// A small markdown renderer that builds DOM nodes: every piece of model text enters
// the page through createTextNode/textContent, never as markup, so a reply cannot
// inject elements, attributes or scripts. Covers what chat replies use: fenced code,
// headings, lists, quotes, paragraphs, inline code, bold, italics and http(s) links.

const FENCE = /^\s*(```|~~~)\s*([\w+#.-]*)\s*$/;
const HEADING = /^(#{1,6})\s+(.*)$/;
const BULLET = /^\s*[-*+]\s+(.*)$/;
const NUMBERED = /^\s*\d{1,9}[.)]\s+(.*)$/;
const QUOTE = /^\s*>\s?(.*)$/;
// inline: `code`, **bold**, *em* or _em_, [text](http...)
const INLINE = /(`[^`\n]+`)|(\*\*[^*\n]+\*\*)|(\*[^*\s][^*\n]*\*)|(_[^_\s][^_\n]*_)|(\[[^\]\n]+\]\([^)\s]+\))/;

function el(tag, cls) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  return node;
}

function safeUrl(href) {
  try {
    const url = new URL(href, window.location.href);
    return ["http:", "https:", "mailto:"].includes(url.protocol) ? url.href : null;
  } catch {
    return null;
  }
}

export function renderInline(parent, text) {
  let rest = text;
  while (rest.length) {
    const m = INLINE.exec(rest);
    if (!m) {
      parent.appendChild(document.createTextNode(rest));
      return;
    }
    if (m.index > 0) parent.appendChild(document.createTextNode(rest.slice(0, m.index)));
    const tok = m[0];
    if (m[1]) {
      const code = el("code");
      code.textContent = tok.slice(1, -1);
      parent.appendChild(code);
    } else if (m[2]) {
      const b = el("strong");
      renderInline(b, tok.slice(2, -2));
      parent.appendChild(b);
    } else if (m[3] || m[4]) {
      const i = el("em");
      renderInline(i, tok.slice(1, -1));
      parent.appendChild(i);
    } else {
      const close = tok.indexOf("](");
      const label = tok.slice(1, close);
      const href = safeUrl(tok.slice(close + 2, -1));
      if (href) {
        const a = el("a");
        a.href = href;
        a.rel = "noopener noreferrer nofollow";
        a.target = "_blank";
        a.textContent = label;
        parent.appendChild(a);
      } else {
        parent.appendChild(document.createTextNode(tok)); // not a link we follow: as text
      }
    }
    rest = rest.slice(m.index + tok.length);
  }
}

// Render `text` into `container` (its previous children are replaced).
export function renderMarkdown(container, text) {
  const out = document.createDocumentFragment();
  const lines = text.replace(/\r\n?/g, "\n").split("\n");
  let para = null;
  let list = null;
  let quote = null;
  const endBlocks = () => {
    para = null;
    list = null;
    quote = null;
  };
  // A new block after whatever was open.
  const open = (tag) => {
    endBlocks();
    const node = el(tag);
    out.appendChild(node);
    return node;
  };
  // A line of a paragraph or a quote: the first line of a new one, or a line break and
  // the line in the one still open.
  const addLine = (block, tag, text) => {
    if (block) block.appendChild(document.createElement("br"));
    else block = open(tag);
    renderInline(block, text);
    return block;
  };
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    const fence = FENCE.exec(line);
    if (fence) {
      const body = [];
      i++;
      while (i < lines.length && !(FENCE.exec(lines[i]) && lines[i].trim().startsWith(fence[1]))) {
        body.push(lines[i]);
        i++;
      }
      const code = el("code");
      if (fence[2]) code.dataset.lang = fence[2];
      code.textContent = body.join("\n"); // a fence still open while streaming: the rest
      open("pre").appendChild(code);
      continue;
    }
    if (!line.trim()) {
      endBlocks();
      continue;
    }
    const heading = HEADING.exec(line);
    if (heading) {
      renderInline(open("h" + Math.min(heading[1].length + 2, 6)), heading[2]);
      continue;
    }
    const bullet = BULLET.exec(line);
    const numbered = bullet ? null : NUMBERED.exec(line);
    if (bullet || numbered) {
      const tag = bullet ? "UL" : "OL";
      if (!list || list.tagName !== tag) list = open(tag.toLowerCase());
      const li = el("li");
      renderInline(li, (bullet || numbered)[1]);
      list.appendChild(li);
      continue;
    }
    const q = QUOTE.exec(line);
    if (q) {
      quote = addLine(quote, "blockquote", q[1]);
      continue;
    }
    if (list && /^\s{2,}\S/.test(line)) {
      // a continuation of the last list item
      list.lastChild.appendChild(document.createTextNode(" "));
      renderInline(list.lastChild, line.trim());
      continue;
    }
    para = addLine(para, "p", line);
  }
  container.replaceChildren(out);
}
