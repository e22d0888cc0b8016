//! The event streams pages follow (server-sent events): a page's part that changes, rendered
//! again and sent when it changed; the feed's messages, each rendered as on the page. The
//! markup goes out as the events' data, one `data:` line per line, so a line end in it must be
//! one the stream reads as such (a CR alone is one too).

use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;

use super::observer::{FeedItem, Observer};
use super::{Part, Site, pages};

/// How often a page's live part is rendered again.
const LIVE_EVERY: Duration = Duration::from_secs(2);
/// How often an idle event stream sends a comment, so that proxies and the browser keep it.
const KEEPALIVE: Duration = Duration::from_secs(15);

/// A page's part as server-sent `part` events: rendered every [`LIVE_EVERY`] and sent when it
/// changed (a comment otherwise, which tells a page gone from one still there), until the
/// page goes or the dashboard stops.
pub(super) async fn live(
    site: &Site,
    part: Part,
    chunks: mpsc::Sender<Bytes>,
    cancel: CancellationToken,
) -> Result<(), mpsc::error::SendError<Bytes>> {
    chunks.send(Bytes::from_static(b"retry: 2000\n\n")).await?;
    let mut last = String::new();
    let mut tick = tokio::time::interval(LIVE_EVERY);
    loop {
        tokio::select! {
            () = cancel.cancelled() => return Ok(()),
            () = chunks.closed() => return Ok(()),
            _ = tick.tick() => {}
        }
        let now = site.part(&part).await.into_string();
        if now == last {
            chunks.send(Bytes::from_static(b": unchanged\n\n")).await?;
        } else {
            chunks.send(sse(Some("part"), None, &now).into()).await?;
            last = now;
        }
    }
}

/// One server-sent event: its type and id when given, `html` as its data (one `data:` line
/// per line, a lone CR or a CR LF ending one as well as a LF: the stream's own line ends; the
/// browser joins them with LFs, as its HTML parser would have read any of the three).
fn sse(kind: Option<&str>, id: Option<u64>, html: &str) -> String {
    let mut out = String::new();
    if let Some(kind) = kind {
        out.push_str(&format!("event: {kind}\n"));
    }
    if let Some(id) = id {
        out.push_str(&format!("id: {id}\n"));
    }
    let html = html.replace("\r\n", "\n").replace('\r', "\n");
    for line in html.trim_end_matches('\n').split('\n') {
        out.push_str("data: ");
        out.push_str(line);
        out.push('\n');
    }
    out.push('\n');
    out
}

/// The feed as server-sent events: each message after `after` (or the browser's
/// `Last-Event-ID` when it reconnects), rendered as on the page, then each arrival, until the
/// page goes (its chunk receiver dropped) or the dashboard stops.
pub(super) async fn events(
    observer: &Observer,
    after: u64,
    channel: Option<String>,
    chunks: mpsc::Sender<Bytes>,
    cancel: CancellationToken,
) -> Result<(), mpsc::error::SendError<Bytes>> {
    let wanted = |item: &FeedItem| channel.as_deref().is_none_or(|c| c == item.channel);
    let (kept, mut arrivals) = observer.follow(after);
    chunks
        .send(Bytes::from_static(b"retry: 2000\n: following\n\n"))
        .await?;
    for item in kept.iter().filter(|i| wanted(i)) {
        chunks.send(event(item).into()).await?;
    }
    let mut keepalive = tokio::time::interval(KEEPALIVE);
    keepalive.tick().await;
    loop {
        tokio::select! {
            () = cancel.cancelled() => return Ok(()),
            () = chunks.closed() => return Ok(()),
            arrived = arrivals.recv() => match arrived {
                Ok(item) if wanted(&item) => chunks.send(event(&item).into()).await?,
                Ok(_) => {}
                Err(broadcast::error::RecvError::Lagged(missed)) => {
                    chunks.send(format!("event: lagged\ndata: {missed}\n\n").into()).await?;
                }
                Err(broadcast::error::RecvError::Closed) => return Ok(()),
            },
            _ = keepalive.tick() => chunks.send(Bytes::from_static(b": keepalive\n\n")).await?,
        }
    }
}

/// One message as an SSE event: its feed position as the id, its HTML as the data.
fn event(item: &FeedItem) -> String {
    sse(None, Some(item.seq), &pages::message(item).into_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_line_of_the_markup_is_data_whatever_ends_it() {
        let event = sse(Some("part"), Some(7), "<p>a\rb</p>\r\n<p>c\nd</p>\n");
        assert_eq!(
            event,
            "event: part\nid: 7\ndata: <p>a\ndata: b</p>\ndata: <p>c\ndata: d</p>\n\n"
        );
    }
}
