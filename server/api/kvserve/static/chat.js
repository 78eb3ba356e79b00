// The chat view: a conversation on a kvserve session (each turn prefills only what it
// added), streamed with a stop button, each reply with its TTFT, tokens/s and cached
// prompt tokens (from the stream's usage chunk).

import { streamJson } from "./api.js";
import { renderMarkdown } from "./markdown.js";

const $ = (id) => document.getElementById(id);

function newSessionId() {
  const bytes = new Uint8Array(8);
  window.crypto.getRandomValues(bytes);
  return "web-" + Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

export class Chat {
  constructor() {
    this.history = []; // {role, content} of finished turns
    this.sessionId = newSessionId();
    this.controller = null;
    $("composer").addEventListener("submit", (e) => {
      e.preventDefault();
      this.send();
    });
    $("prompt").addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey) {
        e.preventDefault();
        this.send();
      }
    });
    $("stop").addEventListener("click", () => this.controller && this.controller.abort());
    $("new-chat").addEventListener("click", () => this.reset());
    this.showSession();
  }

  showSession() {
    $("session-note").textContent = "session " + this.sessionId;
  }

  reset() {
    if (this.controller) this.controller.abort();
    this.history = [];
    this.sessionId = newSessionId(); // the old one expires after its idle TTL
    $("messages").replaceChildren();
    this.showSession();
  }

  bubble(role, text) {
    const box = document.createElement("div");
    box.className = "msg " + role;
    const who = document.createElement("div");
    who.className = "who";
    who.textContent = role;
    const body = document.createElement("div");
    body.className = "body";
    box.append(who, body);
    if (role === "assistant") renderMarkdown(body, text);
    else body.textContent = text; // what the user typed is shown as typed
    $("messages").appendChild(box);
    box.scrollIntoView({ block: "end" });
    return { box, body };
  }

  busy(on) {
    $("send").disabled = on;
    $("stop").disabled = !on;
  }

  async send() {
    const text = $("prompt").value.trim();
    const model = $("model").value;
    if (!text || this.controller || !model) return;
    $("prompt").value = "";
    $("chat-error").hidden = true;
    this.bubble("user", text);
    const turn = { role: "user", content: text };
    const { box, body } = this.bubble("assistant", "");
    box.classList.add("streaming");
    const system = $("system").value.trim();
    const messages = [...(system ? [{ role: "system", content: system }] : []), ...this.history, turn];
    this.controller = new AbortController();
    this.busy(true);
    const t0 = performance.now();
    let tFirst = null;
    let content = "";
    let reasoning = "";
    let usage = null;
    let stopped = false;
    let pending = false;
    const paint = () => {
      pending = false;
      renderMarkdown(body, content || (reasoning ? "*thinking…*" : ""));
    };
    try {
      const request = {
        model,
        messages,
        stream: true,
        stream_options: { include_usage: true },
        session_id: this.sessionId,
      };
      const maxTokens = parseInt($("max-tokens").value, 10);
      if (maxTokens > 0) request.max_tokens = maxTokens;
      for await (const chunk of streamJson("/v1/chat/completions", request, this.controller.signal)) {
        if (chunk.error) throw new Error(chunk.error.message || "the stream failed");
        if (chunk.usage) usage = chunk.usage;
        const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
        if (!delta) continue;
        const piece = (delta.content || "") + (delta.reasoning_content || "");
        if (piece && tFirst === null) tFirst = performance.now();
        content += delta.content || "";
        reasoning += delta.reasoning_content || "";
        if (!pending) {
          pending = true;
          window.requestAnimationFrame(paint);
        }
      }
    } catch (err) {
      if (err.name === "AbortError") stopped = true;
      else {
        $("chat-error").textContent = err.message;
        $("chat-error").hidden = false;
      }
    } finally {
      this.controller = null;
      this.busy(false);
      box.classList.remove("streaming");
    }
    paint();
    if (reasoning) {
      const details = document.createElement("details");
      const summary = document.createElement("summary");
      summary.textContent = "reasoning";
      const pre = document.createElement("pre");
      pre.textContent = reasoning;
      details.append(summary, pre);
      box.insertBefore(details, body);
    }
    if (content || stopped) {
      this.history.push(turn, { role: "assistant", content });
    }
    box.appendChild(this.stats(t0, tFirst, usage, stopped));
  }

  stats(t0, tFirst, usage, stopped) {
    const line = document.createElement("div");
    line.className = "stats";
    const parts = [];
    const now = performance.now();
    if (tFirst !== null) {
      line.dataset.ttft = ((tFirst - t0) / 1000).toFixed(3);
      parts.push("TTFT " + line.dataset.ttft + " s");
    }
    if (usage) {
      const generated = usage.completion_tokens;
      const seconds = tFirst !== null ? (now - tFirst) / 1000 : 0;
      if (generated > 1 && seconds > 0) {
        parts.push(((generated - 1) / seconds).toFixed(1) + " tok/s");
      }
      const cached = (usage.prompt_tokens_details && usage.prompt_tokens_details.cached_tokens) || 0;
      line.dataset.cached = String(cached);
      line.dataset.promptTokens = String(usage.prompt_tokens);
      parts.push(generated + " tokens");
      parts.push("prompt " + usage.prompt_tokens + " (cached " + cached + ")");
    }
    if (stopped) parts.push("stopped");
    line.textContent = parts.join(" · ");
    return line;
  }
}
