//! What a person at the dashboard says: a post on a channel (a reply too, with `replyTo` and
//! the thread's `contextId`, §5), a direct message to an instance, a task for a role, sent
//! with the machine operator's voice ([`Observer::voice`]) like `cotald send`. Each arrives as
//! a form `POST` that the dashboard has already authorized (its cookie, its anti-forgery
//! field, its origin); what the form names is checked against what the space knows, so a typo
//! is refused with the names that exist rather than creating a channel.

use crate::protocol::{Channel, CotalMessage, InstanceId, Part, Routing};

use super::http::{Request, space_url};
use super::observer::Observer;

/// The three forms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Form {
    /// `/spaces/<space>/post`: `channel`, `text`, optional `reply_to` and `context_id`.
    Post,
    /// `/spaces/<space>/dm`: `to` (an instance id), `text`.
    Dm,
    /// `/spaces/<space>/task`: `role`, `text`.
    Task,
}

impl Form {
    /// The form of a path's last segment.
    pub(super) fn of(segment: &str) -> Option<Self> {
        match segment {
            "post" => Some(Form::Post),
            "dm" => Some(Form::Dm),
            "task" => Some(Form::Task),
            _ => None,
        }
    }
}

/// Why a form was not sent; said on the page, with the way back.
#[derive(Debug, thiserror::Error)]
pub(super) enum Refused {
    /// A field is missing or empty.
    #[error("the form has no {0}")]
    Missing(&'static str),
    /// A channel the space has no config and no message of.
    #[error("there is no channel `{name}` in this space; it has: {known}")]
    NoChannel {
        /// What was asked for.
        name: String,
        /// What exists.
        known: String,
    },
    /// A role no agent of the space holds: its tasks would be discarded.
    #[error(
        "no agent of this space holds role `{role}`, so a task for it would be discarded; roles held: {held}"
    )]
    NoRole {
        /// What was asked for.
        role: String,
        /// The roles held.
        held: String,
    },
    /// A name that is not a valid channel, instance id or role.
    #[error("`{0}` is not a valid {1}")]
    Invalid(String, &'static str),
    /// The broker or the space refused the message.
    #[error("not sent: {0}")]
    NotSent(String),
}

/// A message the person sent.
pub(super) struct Posted {
    /// The page to go back to.
    pub back: String,
    /// The message's id.
    pub id: String,
    /// Where it went.
    pub routing: Routing,
    /// Its stream sequence.
    pub sequence: u64,
}

/// Sends what `req` says with `observer`'s voice.
pub(super) async fn send(
    observer: &Observer,
    form: Form,
    req: &Request,
) -> Result<Posted, Refused> {
    let text = req
        .field("text")
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .ok_or(Refused::Missing("text"))?;
    let space = observer.space.as_str();
    let (routing, back) = match form {
        Form::Post => {
            let name = required(req, "channel")?;
            let channel =
                Channel::new(name).map_err(|_| Refused::Invalid(name.to_owned(), "channel"))?;
            let known = known_channels(observer).await;
            if !known.iter().any(|c| c == name) {
                return Err(Refused::NoChannel {
                    name: name.to_owned(),
                    known: known.join(", "),
                });
            }
            let back = space_url(space, "feed", &[("channel", name)]);
            (Routing::channel(&channel), back)
        }
        Form::Dm => {
            let to = required(req, "to")?;
            let target: InstanceId = to
                .parse()
                .map_err(|_| Refused::Invalid(to.to_owned(), "instance id"))?;
            (Routing::to(&target), space_url(space, "direct", &[]))
        }
        Form::Task => {
            let role = required(req, "role")?;
            if role.is_empty() || role.contains(['.', '*', '>', ' ']) {
                return Err(Refused::Invalid(role.to_owned(), "role"));
            }
            held(observer, role)?;
            (Routing::to_service(role), space_url(space, "roster", &[]))
        }
    };
    let voice = &observer.voice;
    let mut message = CotalMessage::new(
        voice.space(),
        voice.endpoint(),
        routing,
        vec![Part::text(text)],
    );
    if form == Form::Post {
        message = message.with_mentions(mentions(text));
        message.reply_to = optional(req, "reply_to");
        message.context_id = optional(req, "context_id");
    }
    let sequence = voice
        .publish(&message)
        .await
        .map_err(|e| Refused::NotSent(crate::ops::error_text(&e)))?;
    tracing::info!(
        space = observer.space,
        id = message.id,
        form = ?form,
        "sent from the dashboard"
    );
    Ok(Posted {
        back,
        id: message.id,
        routing: message.routing,
        sequence,
    })
}

/// Refuses a task for `role` when no identity of the space holds it (the warden would
/// discard it), naming the roles held.
fn held(observer: &Observer, role: &str) -> Result<(), Refused> {
    let mut held: Vec<String> = observer
        .identities
        .active()
        .into_iter()
        .filter_map(|r| r.role)
        .collect();
    held.sort();
    held.dedup();
    if held.iter().any(|h| h == role) {
        return Ok(());
    }
    Err(Refused::NoRole {
        role: role.to_owned(),
        held: match held.is_empty() {
            true => "none".to_owned(),
            false => held.join(", "),
        },
    })
}

fn required<'a>(req: &'a Request, field: &'static str) -> Result<&'a str, Refused> {
    req.field(field)
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .ok_or(Refused::Missing(field))
}

fn optional(req: &Request, field: &str) -> Option<String> {
    req.field(field)
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(str::to_owned)
}

/// The channels a post may go to: those with a config, and those with messages.
/// Asked of the broker: a channel removed with its messages is gone from it at once, while the
/// feed still shows what it had; only when the broker cannot be asked are the feed's channels
/// offered.
pub(super) async fn known_channels(observer: &Observer) -> Vec<String> {
    let mut names: Vec<String> = match observer.client.channels().await {
        Ok(channels) => channels
            .into_iter()
            .map(|c| c.channel.as_str().to_owned())
            .collect(),
        Err(_) => observer.kept().iter().map(|i| i.channel.clone()).collect(),
    };
    names.sort();
    names.dedup();
    names
}

/// The names called out in `text` (`@name`), as §5 carries them (lowercased).
pub(super) fn mentions(text: &str) -> Vec<String> {
    text.split(|c: char| c.is_whitespace() || matches!(c, ',' | ';' | '(' | ')'))
        .filter_map(|word| word.strip_prefix('@'))
        .map(|name| name.trim_end_matches(['.', ':', '!', '?']))
        .filter(|name| {
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | '.'))
        })
        .map(str::to_lowercase)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mentions_are_the_called_out_names() {
        assert_eq!(
            mentions("@Alice, can you and @bob-2 look? thanks @carol. not@me @"),
            ["alice", "bob-2", "carol"]
        );
        assert!(mentions("no one").is_empty());
    }
}
