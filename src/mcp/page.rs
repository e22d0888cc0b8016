//! Bounded answers: the most one `cotal_inbox` or `cotal_thread` answer carries, and how a
//! message is shown in the room a page has left: whole, or a piece of its text.
//!
//! Messages may be up to the broker's 1 MiB; an agent host puts a tool's answer in the agent's
//! context, where one such answer would crowd out everything else. So an answer stays under
//! [`PAGE_BYTES`] of JSON (the structured content; the text content repeats it verbatim), and
//! a text larger than a page is returned in pieces, each saying which bytes it holds.

use schemars::JsonSchema;
use serde::Serialize;

use super::inbox::Fitted;
use super::views::MessageView;

/// The most bytes of JSON one answer carries.
pub(super) const PAGE_BYTES: usize = 64 * 1024;

/// Room kept for what an answer says besides its messages that is filled in after they are
/// chosen (acknowledgement errors, counts).
pub(super) const ENVELOPE_SLACK: usize = 2048;

/// The size of `value` as compact JSON.
pub(super) fn json_len<T: Serialize + ?Sized>(value: &T) -> usize {
    serde_json::to_vec(value).map_or(0, |b| b.len())
}

/// Which bytes of a message's text a piece holds, when the text is larger than a page.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
pub(super) struct TextPart {
    /// The first byte shown.
    pub from: usize,
    /// The byte after the last shown.
    pub to: usize,
    /// The text's whole length in bytes: when `to` is less, the rest comes in the next read.
    pub of: usize,
}

/// Shows `view` (whose `text` is the message's whole text) from byte `from` of its text in
/// `room` bytes of a page of `budget`: whole when it fits; else with the text cut at a
/// character boundary (the non-text parts go with the first piece, or are left out and
/// counted when they alone would fill half a page). `None` when it does not fit in `room`:
/// it waits for the next page. A message whose other fields alone exceed half a page (only a
/// hostile sender makes one) is shown as a short note, so that it costs only itself.
pub(super) fn fit(
    mut view: MessageView,
    from: usize,
    room: usize,
    budget: usize,
) -> Option<Fitted<MessageView>> {
    let text = std::mem::take(&mut view.text);
    let of = text.len();
    let from = from.min(of);
    if from > 0 {
        view.other_parts.clear();
        view.text_part = Some(TextPart { from, to: of, of });
    }
    view.text = text[from..].to_owned();
    let bytes = json_len(&view) + 1;
    if bytes <= room {
        return Some(Fitted {
            view,
            bytes,
            text_to: None,
        });
    }
    let parts = json_len(&view.other_parts);
    if !view.other_parts.is_empty() && parts > budget / 2 {
        view.other_parts.clear();
        view.other_parts_omitted = Some(parts);
    }
    view.text = String::new();
    view.text_part = Some(TextPart { from, to: of, of });
    let base = json_len(&view) + 1;
    if base > budget / 2 {
        return unshowable(view, base, room);
    }
    let keep = room.checked_sub(base)?;
    let mut to = of.min(from + keep);
    loop {
        while !text.is_char_boundary(to) {
            to -= 1;
        }
        if to <= from {
            return None;
        }
        let escaped = json_len(&text[from..to]) - 2;
        if escaped <= keep {
            break;
        }
        to = from + (to - from) * keep / escaped;
    }
    view.text = text[from..to].to_owned();
    view.text_part = Some(TextPart { from, to, of });
    let bytes = json_len(&view) + 1;
    Some(Fitted {
        view,
        bytes,
        text_to: (to < of).then_some(to),
    })
}

/// A message whose fields besides its text take `base` bytes, more than half a page: a short
/// note in its place (it is acknowledged like any other; its sender made it unreadable).
fn unshowable(mut view: MessageView, base: usize, room: usize) -> Option<Fitted<MessageView>> {
    let short = |s: &str| s.chars().take(64).collect::<String>();
    view.id = short(&view.id);
    view.from.name = short(&view.from.name);
    view.from.role = view.from.role.as_deref().map(short);
    view.channel = view.channel.as_deref().map(short);
    view.role = view.role.as_deref().map(short);
    view.mentions.clear();
    view.reply_to = None;
    view.context_id = None;
    view.thread = None;
    view.other_parts.clear();
    view.text_part = None;
    view.text = format!(
        "(not shown: this message's fields besides its text take {base} bytes, more than an \
         answer carries)"
    );
    let bytes = json_len(&view) + 1;
    (bytes <= room).then_some(Fitted {
        view,
        bytes,
        text_to: None,
    })
}
