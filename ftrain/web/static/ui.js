// ftrain ui: live updates. The page carries the stream sequence it shows (body data-seq); the server sends
// the stream's last sequence over /live each time it changes, and then this script fetches the page again
// and swaps its <main> for the new one (one fetch at a time: events landing during it bring one more).
// Nothing else: no inline script, no eval, no third-party code.
"use strict";
(() => {
  const label = document.getElementById("live");
  const say = (text) => {
    if (label) label.textContent = text;
  };
  let busy = false;
  let again = false;
  const refresh = async () => {
    if (busy) {
      again = true;
      return;
    }
    busy = true;
    try {
      const reply = await fetch(location.href, { credentials: "same-origin", cache: "no-store" });
      if (!reply.ok) return say("live · the page answered " + reply.status);
      const fresh = new DOMParser().parseFromString(await reply.text(), "text/html");
      const main = fresh.querySelector("main");
      const old = document.querySelector("main");
      if (main && old) old.replaceWith(document.adoptNode(main));
      document.body.dataset.seq = fresh.body.dataset.seq || document.body.dataset.seq;
      say("live · stream seq " + document.body.dataset.seq);
    } catch (error) {
      say("live · refresh failed");
    } finally {
      busy = false;
      if (again) {
        again = false;
        refresh();
      }
    }
  };
  const source = new EventSource("/live");
  source.onopen = () => say("live · stream seq " + document.body.dataset.seq);
  source.onmessage = (message) => {
    if (message.data !== document.body.dataset.seq) refresh();
  };
  source.onerror = () => say("live · reconnecting");
})();
