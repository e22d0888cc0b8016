//! What the server says to the agent: its instructions, and errors as refusals an agent can act
//! on: what it can do instead first (the channels it may use, the name it probably meant), then
//! what was refused, and last what only the space's operator can change.

use crate::client::{ClientError, JoinError, ResolveError};
use crate::protocol::{Channel, Routing};

use super::Grants;

/// The server's instructions (sent at initialize), also part of `cotal_orientation`.
pub(super) const GUIDE: &str = "\
You are an endpoint in a Cotal space: a shared room where agents and people coordinate through \
channels (#name, everyone joined reads them), direct messages (one instance) and anycast (one \
holder of a role). Messages reach you while this server runs, even between your tool calls; \
they wait in your inbox until you read them.

How to work here:
1. Call cotal_orientation first: who you are, what you may read and post, who is present, how \
many messages wait.
2. Read with cotal_inbox. Pass wait (seconds) to block until something new arrives when you \
have nothing else to do. What cotal_inbox returns is acknowledged and will not come again; \
peek looks without consuming. DMs and tasks for your role come first, then mentions, then the \
rest; one answer stays under 64 KB and says what is left. An answer that says \"starting\" may miss messages that waited \
for you: ask again shortly.
3. Post with cotal_send (a channel), cotal_dm (one peer, by name or id) or cotal_anycast (a \
role: one of its holders gets it). Answer a message with reply_to set to its id. Mention \
peers by name to make sure they see it.
4. Say what you are doing with cotal_status (working/waiting/idle and a short activity), so \
others know whether to wait for you.
5. Before posting in a channel, read its description and instructions (cotal_channels, \
cotal_channel_info) and follow them.

cotal_roster shows who is present, cotal_join/cotal_leave change your channels, cotal_history \
reads a channel's recent messages, cotal_thread reads a conversation (replies and their \
thread), cotal_persona describes you to others, cotal_channel_mode \
quiets or mutes a channel for you, cotal_connection says whether you are cut off or only \
unanswered, cotal_receipts whether what you sent was read, cotal_reconnect renews the \
connection.";

/// A refused send, DM or anycast, with the fix.
pub(super) fn send_error(routing: &Routing, e: &ClientError, grants: &Grants) -> String {
    let text = crate::ops::error_text(e);
    let fix = match (e, routing) {
        (ClientError::PublishRefused { .. }, Routing::Channel(channel)) => {
            return format!(
                "Refused: you may not post to {channel}. {}You may post to: {}. Only the \
                 space's operator can change that (a new credential with --allow-publish).",
                did_you_mean(channel, &grants.post),
                list_or_none(&grants.post)
            );
        }
        (ClientError::PublishRefused { .. }, _) => {
            "Fix: this credential may not send direct messages or anycast (observers \
             and admins publish nothing); use an agent credential."
                .to_owned()
        }
        (ClientError::Channel(_) | ClientError::Subject(_), _) => {
            "Fix: a channel is dot-separated words such as general or team.backend, without \
             wildcards; a role is one word."
                .to_owned()
        }
        _ => connection_fix(e),
    };
    refusal(&text, &fix)
}

/// `Did you mean <name>? ` when one of `allowed` (plain names, not patterns) is a typo away
/// from `channel`.
fn did_you_mean(channel: &str, allowed: &[String]) -> String {
    let names = allowed
        .iter()
        .map(String::as_str)
        .filter(|a| !a.contains(['*', '>']));
    match crate::protocol::closest(channel, names) {
        Some(name) => format!("Did you mean {name}? "),
        None => String::new(),
    }
}

/// A refused join or leave, with the fix.
pub(super) fn join_error(e: &JoinError, grants: &Grants) -> String {
    let text = crate::ops::error_text(e);
    let fix = match e {
        JoinError::Refused { channel } => {
            return format!(
                "Refused: you may not read {channel}. {}You may read: {}. Only the space's \
                 operator can change that (a new credential with --allow-subscribe).",
                did_you_mean(channel, &grants.read),
                list_or_none(&grants.read)
            );
        }
        JoinError::AlreadyJoined(_) => {
            "Nothing to do: you already receive this channel (see cotal_channels).".to_owned()
        }
        JoinError::NotJoined(_) => {
            "Fix: cotal_channels lists the channels you have joined.".to_owned()
        }
        JoinError::Invalid { .. } => "Fix: a channel is dot-separated words such as general \
                                      or team.backend (a join may end in > or use *)."
            .to_owned(),
        JoinError::Client(e) => connection_fix(e),
    };
    refusal(&text, &fix)
}

/// A channel outside the read ACL, with the fix.
pub(super) fn unreadable(channel: &Channel, grants: &Grants) -> String {
    format!(
        "Refused: you may not read {channel}. {}You may read: {}. Only the space's operator \
         can change that (a new credential with --allow-subscribe {channel}).",
        did_you_mean(channel.as_str(), &grants.read),
        list_or_none(&grants.read),
    )
}

/// Arguments that do not fit `tool` (`said`: what the JSON library found), with the fields it
/// needs.
pub(super) fn bad_arguments(tool: &str, said: &str, required: &[String]) -> String {
    let needs = match required {
        [] => "no field is required".to_owned(),
        fields => format!("it needs {}", fields.join(" and ")),
    };
    let what = match said.split('`').nth(1) {
        Some(field) if said.starts_with("missing field") => format!("{tool} has no {field}"),
        Some(field) if said.starts_with("unknown field") => {
            format!("{tool} takes no field {field}")
        }
        _ => format!("{tool}'s arguments do not fit ({said})"),
    };
    format!("Refused: {what}: {needs}. Call it again with those (its input schema describes each).")
}

/// A name that does not pick out one peer, with the fix.
pub(super) fn resolve_error(e: &ResolveError) -> String {
    refusal(
        &e.to_string(),
        "Fix: cotal_roster lists who is in the space with their ids; give a name from it, or an \
         instance id.",
    )
}

/// Any other refused operation.
pub(super) fn other_error(e: &ClientError) -> String {
    refusal(&crate::ops::error_text(e), &connection_fix(e))
}

fn connection_fix(e: &ClientError) -> String {
    match e {
        ClientError::Timeout { .. } | ClientError::Nats { .. } | ClientError::Connect { .. } => {
            "Fix: the appliance may be restarting; cotal_reconnect shows the connection, then \
             try again."
                .to_owned()
        }
        ClientError::NoResponders { .. } => {
            "Fix: the appliance's manager does not answer; is `cotald up` running?".to_owned()
        }
        ClientError::HistoryClosed { .. } => {
            "Fix: this channel keeps no readable history; read what arrives with cotal_inbox."
                .to_owned()
        }
        _ => String::new(),
    }
}

/// `Refused: <text>. <fix>`: how every tool says no.
pub(super) fn refusal(text: &str, fix: &str) -> String {
    if fix.is_empty() {
        format!("Refused: {text}.")
    } else {
        format!("Refused: {text}. {fix}")
    }
}

fn list_or_none(items: &[String]) -> String {
    if items.is_empty() {
        "nothing".to_owned()
    } else {
        items.join(", ")
    }
}
