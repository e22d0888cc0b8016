// cotald dashboard: follows the feed's event stream. The server renders and escapes every
// message; this only puts what it sends at the top of the list, and keeps the list bounded.
"use strict";
(function () {
  const feed = document.getElementById("feed");
  if (!feed) return;
  const live = document.getElementById("live");
  const keep = 1000;
  const source = new EventSource(feed.dataset.events);
  source.onopen = () => { live.textContent = "live"; live.classList.add("on"); };
  source.onerror = () => { live.textContent = "reconnecting…"; live.classList.remove("on"); };
  source.addEventListener("lagged", (e) => {
    live.textContent = "live (" + e.data + " messages skipped: too fast to show)";
  });
  source.onmessage = (e) => {
    feed.insertAdjacentHTML("afterbegin", e.data);
    const added = feed.firstElementChild;
    if (added) added.classList.add("fresh");
    while (feed.children.length > keep) feed.lastElementChild.remove();
  };
})();
