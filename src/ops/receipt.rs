//! `receipt`: where a message sent to a channel, an instance or a role goes, as the appliance
//! sees it at the moment of asking: how many durable members it is stored for and how many of
//! them are away, how many instances are subscribed live, whether a DM's target is online,
//! how many hold a role and are online. A report for the sender, never an input to delivery
//! (like §8's membership feed, it is display only).
//!
//! `read`: whether a message the caller sent was acknowledged by its reader, from what the
//! broker already keeps (the reading durable's ack floor and delivered position, §8; the
//! positions the members registry saved for a durable channel, §7).

use serde::{Deserialize, Serialize};

/// What a receipt is asked for: the routing of the message sent (§4).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
pub enum ReceiptFor {
    /// A channel.
    Channel(String),
    /// An instance (a DM).
    To(String),
    /// A role (anycast).
    Role(String),
}

impl ReceiptFor {
    /// Where a message with `routing` goes.
    pub fn of(routing: &crate::protocol::Routing) -> ReceiptFor {
        use crate::protocol::Routing;
        match routing {
            Routing::Channel(c) => ReceiptFor::Channel(c.clone()),
            Routing::To(id) => ReceiptFor::To(id.clone()),
            Routing::ToService(role) => ReceiptFor::Role(role.clone()),
        }
    }
}

/// How a message travels (§4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    /// A `durable` channel: stored, and handed to each durable member.
    Durable,
    /// A `live` channel: to who is subscribed now.
    Live,
    /// A DM: stored in the target's inbox.
    Dm,
    /// A task: stored for one holder of the role.
    Task,
}

/// `receipt`'s reply. A count the appliance could not establish is absent (unknown), never 0.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    /// How the message travels.
    pub tier: Tier,
    /// Durable channel: the members it is stored for (the sender not counted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub durable_members: Option<u32>,
    /// Of those, how many are away now (they get it when they come back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub durable_away: Option<u32>,
    /// Channel: the instances subscribed to it now, the sender and observers not counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live_now: Option<u32>,
    /// DM: the target's name, when it is an identity of the space.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// DM: whether the target is online now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_online: Option<bool>,
    /// Task: the identities of the space holding the role.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role_holders: Option<u32>,
    /// Task: how many of them are online now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role_online: Option<u32>,
}

impl Receipt {
    /// A receipt of `tier` that knows nothing yet: every count unknown.
    pub fn unknown(tier: Tier) -> Receipt {
        Receipt {
            tier,
            durable_members: None,
            durable_away: None,
            live_now: None,
            target: None,
            target_online: None,
            role_holders: None,
            role_online: None,
        }
    }

    /// What happened, in words a person or an agent reads.
    pub fn words(&self) -> String {
        let unknown = "unknown";
        let count = |n: Option<u32>| n.map_or(unknown.to_owned(), |n| n.to_string());
        let live = match self.live_now {
            Some(0) => "nobody is subscribed now, so nobody received it live".to_owned(),
            Some(1) => "1 subscriber received it live".to_owned(),
            Some(n) => format!("{n} subscribers received it live"),
            None => "how many received it live is unknown".to_owned(),
        };
        match self.tier {
            Tier::Durable => {
                let members = match (self.durable_members, self.durable_away) {
                    (Some(0), _) => "stored; no durable member to keep it for".to_owned(),
                    (Some(n), Some(0)) => format!("stored for {n} durable members, all online"),
                    (Some(n), Some(away)) => format!(
                        "stored for {n} durable members ({away} away: they get it when they \
                         come back)"
                    ),
                    (n, _) => format!("stored for {} durable members", count(n)),
                };
                format!("{members}; {live}")
            }
            Tier::Live => format!("live channel: {live}; it is not kept for anyone away"),
            Tier::Dm => {
                let who = self.target.as_deref().unwrap_or("the target");
                match self.target_online {
                    Some(true) => format!("stored in {who}'s inbox; {who} is online"),
                    Some(false) => format!(
                        "stored in {who}'s inbox; {who} is away and reads it on coming back"
                    ),
                    None => format!("stored in {who}'s inbox; whether {who} is online is unknown"),
                }
            }
            Tier::Task => match (self.role_holders, self.role_online) {
                (Some(0), _) => "no identity of the space holds this role: the task will be \
                                 discarded"
                    .to_owned(),
                (_, Some(0)) => {
                    "queued: nobody holding the role is online; the first holder that connects \
                     takes it"
                        .to_owned()
                }
                (_, Some(n)) => format!("queued for the role: {n} holders online, one takes it"),
                (holders, None) => format!(
                    "queued for the role ({} holders; how many are online is unknown)",
                    count(holders)
                ),
            },
        }
    }
}

/// `read`'s arguments: a message the caller sent, by where it went and the stream sequence
/// its publish acknowledgement returned.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReadFor {
    /// Where it went.
    pub to: ReceiptFor,
    /// Its stream sequence.
    pub sequence: u64,
}

/// Where one copy is, as its reading durable says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReadState {
    /// Acknowledged by its reader (a DM read, a task done).
    Read,
    /// Handed to a reader and not acknowledged yet.
    Delivered,
    /// Not handed to any reader yet.
    Waiting,
}

/// `read`'s reply. What the broker could not say is absent (unknown), never guessed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadReceipt {
    /// How the message travels.
    pub tier: Tier,
    /// DM or task: where the copy is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<ReadState>,
    /// Durable channel: the members it is due to (the sender not counted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub due_to: Option<u32>,
    /// Durable channel: of those, how many acknowledged it by their saved positions (saved
    /// when a member's session ends: a member reading now is counted once it leaves).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_by_at_least: Option<u32>,
}

impl ReadReceipt {
    /// Whether it was read, in words.
    pub fn words(&self) -> String {
        match (self.tier, self.state) {
            (Tier::Live, _) => "a live channel keeps no read state".to_owned(),
            (Tier::Durable, _) => match (self.read_by_at_least, self.due_to) {
                (Some(read), Some(due)) => format!(
                    "acknowledged by at least {read} of the {due} durable members it is due to \
                     (positions are saved when a member's session ends)"
                ),
                _ => "which durable members acknowledged it is unknown".to_owned(),
            },
            (Tier::Dm, Some(ReadState::Read)) => "read: the recipient acknowledged it".to_owned(),
            (Tier::Dm, Some(ReadState::Delivered)) => {
                "delivered to the recipient, not acknowledged yet".to_owned()
            }
            (Tier::Dm, Some(ReadState::Waiting)) => {
                "not delivered yet: it waits for the recipient".to_owned()
            }
            (Tier::Task, Some(ReadState::Read)) => {
                "a holder of the role took it and acknowledged it".to_owned()
            }
            (Tier::Task, Some(ReadState::Delivered)) => {
                "a holder of the role took it, not acknowledged yet".to_owned()
            }
            (Tier::Task, Some(ReadState::Waiting)) => "queued: no holder took it yet".to_owned(),
            (_, None) => "whether it was read is unknown".to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn receipt(tier: Tier) -> Receipt {
        Receipt::unknown(tier)
    }

    #[test]
    fn each_tier_says_where_the_message_went_and_unknown_is_said() {
        let durable = Receipt {
            durable_members: Some(3),
            durable_away: Some(1),
            live_now: Some(2),
            ..receipt(Tier::Durable)
        };
        assert_eq!(
            durable.words(),
            "stored for 3 durable members (1 away: they get it when they come back); 2 \
             subscribers received it live"
        );
        let live = Receipt {
            live_now: Some(0),
            ..receipt(Tier::Live)
        };
        assert!(
            live.words().contains("nobody is subscribed now"),
            "{}",
            live.words()
        );
        assert!(receipt(Tier::Live).words().contains("unknown"));
        let dm = Receipt {
            target: Some("bob".into()),
            target_online: Some(false),
            ..receipt(Tier::Dm)
        };
        assert_eq!(
            dm.words(),
            "stored in bob's inbox; bob is away and reads it on coming back"
        );
        let task = Receipt {
            role_holders: Some(0),
            ..receipt(Tier::Task)
        };
        assert!(task.words().contains("discarded"));
        let json = serde_json::to_value(&live).unwrap();
        assert_eq!(json, serde_json::json!({"tier": "live", "live_now": 0}));
        let asked = serde_json::to_value(ReceiptFor::Channel("general".into())).unwrap();
        assert_eq!(asked, serde_json::json!({"channel": "general"}));
    }

    #[test]
    fn a_read_receipt_says_where_the_copy_is_and_unknown_is_said() {
        let dm = |state| ReadReceipt {
            tier: Tier::Dm,
            state,
            due_to: None,
            read_by_at_least: None,
        };
        assert!(dm(Some(ReadState::Read)).words().starts_with("read"));
        assert!(
            dm(Some(ReadState::Waiting))
                .words()
                .contains("not delivered yet")
        );
        assert!(dm(None).words().contains("unknown"));
        let durable = ReadReceipt {
            tier: Tier::Durable,
            state: None,
            due_to: Some(3),
            read_by_at_least: Some(1),
        };
        assert!(
            durable
                .words()
                .starts_with("acknowledged by at least 1 of the 3")
        );
        let json = serde_json::to_value(dm(Some(ReadState::Delivered))).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"tier": "dm", "state": "delivered"})
        );
    }
}
