// cotald dashboard: follows the feed's event stream. The server renders and escapes every
// message; this only appends what it sends, and keeps the list bounded.
"use strict";
(function () {
  const feed = document.getElementById("feed");
  if (!feed) return;
  const live = document.getElementById("live");
  const keep = 1000;
  const bottom = () => window.innerHeight + window.scrollY >= document.body.scrollHeight - 40;
  const source = new EventSource(feed.dataset.events);
  source.onopen = () => { live.textContent = "live"; live.classList.add("on"); };
  source.onerror = () => { live.textContent = "reconnecting…"; live.classList.remove("on"); };
  source.addEventListener("lagged", (e) => {
    live.textContent = "live (" + e.data + " messages skipped: too fast to show)";
  });
  source.onmessage = (e) => {
    const follow = bottom();
    feed.insertAdjacentHTML("beforeend", e.data);
    const added = feed.lastElementChild;
    if (added) added.classList.add("fresh");
    while (feed.children.length > keep) feed.firstElementChild.remove();
    if (follow) window.scrollTo(0, document.body.scrollHeight);
  };
  window.scrollTo(0, document.body.scrollHeight);
})();
