// Calls to kvserve's own API, with the key the user typed (kept in localStorage only).

const KEY = "kvserve.apiKey";

export function apiKey() {
  return window.localStorage.getItem(KEY) || "";
}

export function setApiKey(key) {
  if (key) window.localStorage.setItem(KEY, key);
  else window.localStorage.removeItem(KEY);
}

export function headers(json = false) {
  const h = {};
  if (json) h["Content-Type"] = "application/json";
  const key = apiKey();
  if (key) h.Authorization = "Bearer " + key;
  return h;
}

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

// The error message of a non-2xx answer, in any of kvserve's error shapes.
export async function errorOf(response) {
  let message = response.status + " " + response.statusText;
  try {
    const body = await response.json();
    const err = body.error || body;
    if (typeof err === "string") message = err;
    else if (err && err.message) message = err.message;
  } catch {
    // not JSON: the status line says enough
  }
  return new ApiError(response.status, message);
}

export async function getJson(path) {
  const response = await fetch(path, { headers: headers() });
  if (!response.ok) throw await errorOf(response);
  return response.json();
}

// POST `body` and yield each SSE `data:` payload, parsed, until [DONE].
export async function* streamJson(path, body, signal) {
  const response = await fetch(path, {
    method: "POST",
    headers: headers(true),
    body: JSON.stringify(body),
    signal,
  });
  if (!response.ok) throw await errorOf(response);
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data:")) continue; // comments (": loading") and event names
        const data = line.slice(5).trim();
        if (data === "[DONE]") return;
        yield JSON.parse(data);
      }
    }
  }
}
