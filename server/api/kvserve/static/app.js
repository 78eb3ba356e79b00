// The page at /: tabs, the API-key field (shown when the server asks for a key), the
// model picker. The views live in chat.js and status.js.

import { apiKey, getJson, setApiKey } from "./api.js";
import { Chat } from "./chat.js";
import { StatusView } from "./status.js";

const $ = (id) => document.getElementById(id);
const status = new StatusView();

function show(tab) {
  const chat = tab === "chat";
  $("chat-view").hidden = !chat;
  $("status-view").hidden = chat;
  $("tab-chat").classList.toggle("active", chat);
  $("tab-status").classList.toggle("active", !chat);
  if (chat) status.stop();
  else status.start();
  const hash = chat ? "" : "#server";
  if (window.location.hash !== hash) window.history.replaceState(null, "", hash || window.location.pathname);
}

// What a model takes, as /v1/models says it (meta.modalities, llama-server's /props
// shape: vision once a projector is loaded); "" while it is not loaded (not known yet).
function takes(meta) {
  if (!meta || !meta.modalities) return "";
  return meta.modalities.vision ? "text, images" : "text";
}

// The picked model's modalities beside the picker.
function showTakes() {
  const option = $("model").selectedOptions[0];
  const what = option ? option.dataset.modalities : "";
  $("model-takes").textContent = what ? "takes " + what.replace(", ", " and ") : "";
}

async function loadModels() {
  const select = $("model");
  try {
    const list = await getJson("/v1/models");
    const previous = select.value;
    select.replaceChildren(
      ...list.data.map((m) => {
        const option = document.createElement("option");
        const what = takes(m.meta);
        option.value = m.id;
        option.dataset.modalities = what;
        option.textContent = m.id + (what.includes("images") ? " · images" : "") +
          (m.meta && m.meta.state !== "loaded" ? " (" + m.meta.state + ")" : "");
        return option;
      }),
    );
    if (previous) select.value = previous;
    showTakes();
    $("chat-error").hidden = true;
  } catch (err) {
    if (err.status === 401) {
      $("key-bar").hidden = false; // the server has keys: ask for one
      $("api-key").focus();
    }
    $("chat-error").textContent = "models: " + err.message;
    $("chat-error").hidden = false;
  }
}

function init() {
  new Chat();
  $("tab-chat").addEventListener("click", () => show("chat"));
  $("tab-status").addEventListener("click", () => show("status"));
  $("model").addEventListener("change", showTakes);
  if (apiKey()) {
    $("key-bar").hidden = false;
    $("api-key").value = apiKey();
  }
  $("save-key").addEventListener("click", () => {
    setApiKey($("api-key").value.trim());
    loadModels();
    if (!$("status-view").hidden) status.refresh();
  });
  loadModels();
  const fromHash = () => show(window.location.hash === "#server" ? "status" : "chat");
  window.addEventListener("hashchange", fromHash);
  fromHash();
}

init();
