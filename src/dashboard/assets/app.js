// cotald dashboard. The server renders and escapes every message and every part of a page;
// this only places what its event streams send: an arriving message at the top of the feed,
// or under the message it replies to; a page's changing part in place (what the reader opened
// stays open). Times are shown in the reader's own locale and zone.
"use strict";
(function () {
  // One formatter for every time: made per call (toLocaleString), it cost the feed's 500 times
  // a tenth of a second at each load.
  const timeFormat = new Intl.DateTimeFormat(undefined, {
    year: "numeric", month: "short", day: "numeric",
    hour: "2-digit", minute: "2-digit", second: "2-digit", timeZoneName: "short",
  });
  function localTimes(root) {
    for (const t of root.querySelectorAll("time[datetime]")) {
      const when = new Date(t.getAttribute("datetime"));
      if (!isNaN(when)) {
        t.title = t.getAttribute("datetime");
        t.textContent = timeFormat.format(when);
      }
    }
  }
  localTimes(document);

  const live = document.getElementById("live");
  function following(source) {
    if (!live) return;
    source.addEventListener("open", () => { live.textContent = "live"; live.classList.add("on"); });
    source.addEventListener("error", () => { live.textContent = "reconnecting…"; live.classList.remove("on"); });
  }

  const feed = document.getElementById("feed");
  if (feed) {
    const keep = 1000;
    const source = new EventSource(feed.dataset.events);
    following(source);
    source.addEventListener("lagged", (e) => {
      live.textContent = "live (" + e.data + " messages skipped: too fast to show)";
    });
    source.onmessage = (e) => {
      const holder = document.createElement("ol");
      holder.innerHTML = e.data;
      const added = holder.firstElementChild;
      if (!added) return;
      localTimes(added);
      added.classList.add("fresh");
      const parent = added.dataset.replyTo &&
        document.getElementById("m-" + added.dataset.replyTo);
      const replies = parent && parent.querySelector(":scope > ol.replies");
      if (replies) {
        replies.appendChild(added);
      } else {
        feed.insertBefore(added, feed.firstElementChild);
      }
      while (feed.children.length > keep) feed.lastElementChild.remove();
    };
  }

  const part = document.getElementById("part");
  if (part && part.dataset.live) {
    const source = new EventSource(part.dataset.live);
    source.addEventListener("part", (e) => {
      const open = new Set();
      for (const d of part.querySelectorAll("details[open][data-key]")) open.add(d.dataset.key);
      part.innerHTML = e.data;
      for (const d of part.querySelectorAll("details[data-key]")) {
        if (open.has(d.dataset.key)) d.open = true;
      }
      localTimes(part);
    });
  }
})();
