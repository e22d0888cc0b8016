//! What the soak sent, to whom it is owed, and what each agent received: the judge of
//! "nothing lost, nothing across a leave or a revocation, nothing read twice by a resumed
//! session". Every message carries a token (`soak#<n>`) in its text; a receipt is a token seen
//! by an agent. Times within [`MARGIN`] of a leave, a join or a revocation are not judged either
//! way: the soak's clock and the broker's are not one.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// The slack around a membership change or a revocation.
pub(super) const MARGIN: Duration = Duration::from_secs(2);

/// A message's token.
pub(super) type Token = u64;

/// The text that carries `token`.
pub(super) fn tagged(token: Token, what: &str) -> String {
    format!("soak#{token} {what}")
}

/// Every token in `text`.
pub(super) fn tokens(text: &str) -> impl Iterator<Item = Token> + '_ {
    text.split("soak#").skip(1).filter_map(|rest| {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        rest[..digits].parse().ok()
    })
}

/// What a message is, as the soak sends it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum Kind {
    /// A post on the durable channel every library agent belongs to.
    Durable,
    /// A post on a live channel: owed to nobody.
    Live,
    /// A DM.
    Dm,
    /// A post on the live channel that mentions one agent: stored for it (§4).
    Mention,
    /// A task for a role.
    Task,
    /// A reply in a thread, on the durable channel.
    Reply,
}

impl Kind {
    /// A post on the durable channel (a reply is one too).
    fn is_post(self) -> bool {
        matches!(self, Kind::Durable | Kind::Reply)
    }

    /// A kind whose copy owed to an agent may come to its next session when the ending one
    /// handled the message before the copy came (its client counts those as unsettled).
    fn may_come_again(self) -> bool {
        self.is_post() || self == Kind::Mention
    }
}

/// Who a stored message is owed to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Owe {
    /// Every member of the durable channel at the time, but its sender.
    Members { sender: usize },
    /// One agent.
    Agent(usize),
    /// One holder of a role, any.
    Role(String),
}

#[derive(Debug)]
struct Sent {
    /// When the send began and when the broker acknowledged it: it was stored in between.
    at: Instant,
    stored: Instant,
    kind: Kind,
    owed: Vec<Owe>,
}

/// A membership change: when it was asked for and when it was done (it took effect in
/// between, at a moment the soak cannot see).
#[derive(Debug, Clone, Copy)]
struct Change {
    asked: Instant,
    done: Instant,
}

/// One span of membership of the durable channel.
#[derive(Debug)]
struct Span {
    joined: Change,
    left: Option<Change>,
}

/// A delivery owed and not received.
#[derive(Debug)]
enum Missed<'a> {
    /// By this agent.
    Agent(usize),
    /// By any holder of this role.
    Role(&'a str),
}

/// One agent's book.
#[derive(Debug)]
struct Book {
    role: String,
    /// Its spans of membership of the durable channel.
    member: Vec<Span>,
    revoked: Option<Instant>,
    /// The soak could not start its next session (a fault's error says why): what it was
    /// owed and had not read waits in its backlog, for a session that never came.
    abandoned: bool,
    session: u32,
    received: HashMap<Token, Receipt>,
    /// How many durable-channel posts its last session handled but could not settle: that
    /// many may be read again.
    unsettled: u32,
}

/// What a session that ended could not confirm, as its client and the soak know it.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Unconfirmed {
    /// From when its acknowledgements are not known to have arrived (a credential revoked
    /// under it, a close whose last acknowledgements went unanswered).
    pub(super) since: Option<Instant>,
    /// Posts of durable channels it handled from their live copy whose durable copy had not
    /// come by its end (any time in the session), and mentions of it handled before their
    /// mention copy came.
    pub(super) posts: usize,
}

/// What an agent received of one token.
#[derive(Debug, Default)]
struct Receipt {
    count: u32,
    /// The session that first acknowledged it, and when.
    acked: Option<(u32, Instant)>,
    /// Acknowledged by a session that ended without its client confirming its last
    /// acknowledgements: it may come again, as at-least-once allows.
    unconfirmed: bool,
}

impl Book {
    /// Whether a message sent as `sent` was stored while the agent was surely a member: after
    /// its join was done, before its leave was asked for (margins aside).
    fn member_at(&self, sent: &Sent) -> bool {
        self.member.iter().any(|span| {
            span.joined.done + MARGIN <= sent.at
                && span.left.is_none_or(|l| sent.stored + MARGIN <= l.asked)
        })
    }

    /// Whether a message sent as `sent` was stored while the agent was surely out: after a
    /// leave was done, before the next join was asked for (margins aside).
    fn out_at(&self, sent: &Sent) -> bool {
        self.member.iter().enumerate().any(|(i, span)| {
            let next = self.member.get(i + 1).map(|s| s.joined.asked);
            span.left.is_some_and(|l| {
                l.done + MARGIN <= sent.at && next.is_none_or(|j| sent.stored + MARGIN <= j)
            })
        })
    }

    fn revoked_before(&self, t: Instant) -> bool {
        self.revoked.is_some_and(|r| r + MARGIN <= t)
    }
}

/// The soak's figures of delivery.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub(super) struct Tally {
    /// Sends the broker acknowledged, by kind.
    pub(super) sent: HashMap<&'static str, u64>,
    /// Sends that failed or whose outcome is unknown (none is owed).
    pub(super) send_failed: u64,
    /// Deliveries owed (an agent and a token; one per role for a task).
    pub(super) owed: u64,
    /// Owed and not received.
    pub(super) lost: u64,
    /// Not received by an agent whose next session the soak could not start: kept for it,
    /// not judged (reported among the faults not carried out).
    pub(super) unjudged: u64,
    /// Receipts beyond the first of a token by an agent within its session.
    pub(super) duplicates: u64,
    /// Tokens a resumed session received again after an earlier session read them.
    pub(super) reread: u64,
    /// Tokens received again after the session that acknowledged them ended unconfirmed (its
    /// connection cut by a re-issue, or its client said its last acks were not confirmed):
    /// allowed, counted.
    pub(super) reread_unconfirmed: u64,
    /// Durable posts received from a span the agent was not a member.
    pub(super) across_leave: u64,
    /// Messages sent after an agent's revocation that it received.
    pub(super) after_revoke: u64,
}

/// The whole book of a soak.
#[derive(Debug, Default)]
pub(super) struct Ledger {
    sent: HashMap<Token, Sent>,
    failed: u64,
    books: Vec<Book>,
    duplicates: u64,
    reread: u64,
    reread_unconfirmed: u64,
    across_leave: u64,
    after_revoke: u64,
    /// The first of what was read again, across a leave or after a revocation, in words.
    offences: Vec<String>,
}

/// How many offences are kept in words.
const OFFENCES_KEPT: usize = 20;

impl Ledger {
    /// A new agent of `role`, a member of the durable channel from `now` when `member`.
    pub(super) fn agent(&mut self, role: &str, member: bool, now: Instant) -> usize {
        self.books.push(Book {
            role: role.to_owned(),
            member: if member {
                let joined = Change {
                    asked: now,
                    done: now,
                };
                vec![Span { joined, left: None }]
            } else {
                Vec::new()
            },
            revoked: None,
            abandoned: false,
            session: 0,
            received: HashMap::new(),
            unsettled: 0,
        });
        self.books.len() - 1
    }

    /// `agent` left the durable channel: asked at `asked`, done at `done`.
    pub(super) fn left(&mut self, agent: usize, asked: Instant, done: Instant) {
        if let Some(span @ Span { left: None, .. }) = self.books[agent].member.last_mut() {
            span.left = Some(Change { asked, done });
        }
    }

    /// `agent` joined the durable channel again: asked at `asked`, done at `done`.
    pub(super) fn joined(&mut self, agent: usize, asked: Instant, done: Instant) {
        let joined = Change { asked, done };
        self.books[agent].member.push(Span { joined, left: None });
    }

    /// A new session of the agent (its host restarted, its credential re-issued). What the
    /// ending session acknowledged from `unconfirmed.since` on (less the margin) may come
    /// again, and so may as many durable posts and mentions as it could not settle.
    pub(super) fn resumed(&mut self, agent: usize, unconfirmed: Unconfirmed) {
        let book = &mut self.books[agent];
        book.unsettled = u32::try_from(unconfirmed.posts).unwrap_or(u32::MAX);
        if let Some(since) = unconfirmed.since {
            let ending = book.session;
            for receipt in book.received.values_mut() {
                if let Some((session, at)) = receipt.acked
                    && session == ending
                    && since <= at + MARGIN
                {
                    receipt.acked = None;
                    receipt.unconfirmed = true;
                }
            }
        }
        book.session += 1;
    }

    pub(super) fn revoked(&mut self, agent: usize, now: Instant) {
        self.books[agent].revoked = Some(now);
    }

    /// The soak could not start `agent`'s next session: nothing it had not read is judged.
    pub(super) fn abandoned(&mut self, agent: usize) {
        self.books[agent].abandoned = true;
    }

    /// `token` was sent from `at` and acknowledged by the broker at `stored`.
    pub(super) fn sent(
        &mut self,
        token: Token,
        kind: Kind,
        owed: Vec<Owe>,
        at: Instant,
        stored: Instant,
    ) {
        let sent = Sent {
            at,
            stored,
            kind,
            owed,
        };
        self.sent.insert(token, sent);
    }

    pub(super) fn send_failed(&mut self) {
        self.failed += 1;
    }

    /// `agent` was shown `token` as history on a join. History owes nothing and may show
    /// anything again, so it is never a duplicate nor an offence; but a message owed to the
    /// agent that it was first shown as history was surfaced then (§7: a message surfaces
    /// once; the owed copy is acknowledged with the history copy), so that is its receipt.
    pub(super) fn shown_as_history(
        &mut self,
        agent: usize,
        token: Token,
        acked: bool,
        now: Instant,
    ) {
        let book = &mut self.books[agent];
        let session = book.session;
        book.received.entry(token).or_insert_with(|| Receipt {
            count: 1,
            acked: acked.then_some((session, now)),
            unconfirmed: false,
        });
    }

    /// `agent` received `token`, and acknowledged it when `acked` (a receipt whose ack
    /// failed may come again, in any session).
    pub(super) fn received(&mut self, agent: usize, token: Token, acked: bool, now: Instant) {
        let book = &mut self.books[agent];
        let session = book.session;
        let receipt = book.received.entry(token).or_default();
        receipt.count += 1;
        let (count, acked_in) = (receipt.count, receipt.acked.map(|(s, _)| s));
        let acked_ago = receipt
            .acked
            .map(|(_, at)| now.duration_since(at).as_secs_f64());
        if acked && acked_in.is_none() {
            receipt.acked = Some((session, now));
        }
        let unconfirmed = std::mem::take(&mut receipt.unconfirmed);
        let kind = self.sent.get(&token).map(|s| s.kind);
        let post = kind.is_some_and(Kind::is_post);
        let unsettled_kind = kind.is_some_and(Kind::may_come_again);
        match acked_in {
            _ if unconfirmed => self.reread_unconfirmed += 1,
            Some(earlier) if earlier < session && unsettled_kind && book.unsettled > 0 => {
                book.unsettled -= 1;
                self.reread_unconfirmed += 1;
            }
            Some(earlier) if earlier < session => {
                self.reread += 1;
                let kind = kind.map_or("unknown", kind_name);
                let ago = acked_ago.unwrap_or_default();
                self.offence(format!(
                    "agent #{agent} read soak#{token} ({kind}) again in session {session} \
                     (acknowledged in {earlier}, {ago:.1} s before)"
                ));
            }
            _ if count > 1 => {
                self.duplicates += 1;
                let kind = self
                    .sent
                    .get(&token)
                    .map_or("unknown", |s| kind_name(s.kind));
                self.offence(format!(
                    "agent #{agent} got soak#{token} ({kind}) {count} times in session {session}"
                ));
            }
            _ => {}
        }
        let Some(sent) = self.sent.get(&token) else {
            return;
        };
        let book = &self.books[agent];
        let across_leave = count == 1 && post && book.out_at(sent);
        let after_revoke = count == 1 && book.revoked_before(sent.at);
        if across_leave {
            self.across_leave += 1;
            self.offence(format!(
                "agent #{agent} got soak#{token}, posted while it was out"
            ));
        }
        if after_revoke {
            self.after_revoke += 1;
            self.offence(format!(
                "agent #{agent} got soak#{token}, sent after its revocation"
            ));
        }
    }

    /// The figures as they stand; what was sent before `settled` and is still missing counts
    /// as lost (the end of a run: everything; while running: what had time to arrive).
    pub(super) fn tally(&self, settled: Instant) -> Tally {
        let mut tally = Tally {
            send_failed: self.failed,
            duplicates: self.duplicates,
            reread: self.reread,
            reread_unconfirmed: self.reread_unconfirmed,
            across_leave: self.across_leave,
            after_revoke: self.after_revoke,
            ..Tally::default()
        };
        for (token, sent) in &self.sent {
            *tally.sent.entry(kind_name(sent.kind)).or_default() += 1;
            for owe in &sent.owed {
                let (owed, missing) = self.judge(*token, sent, owe);
                tally.owed += owed;
                if sent.at <= settled {
                    tally.lost += missing.len() as u64;
                }
                tally.unjudged += self.unjudged(*token, sent, owe);
            }
        }
        tally
    }

    /// How many deliveries one obligation of a message owes, and which of them are missing.
    fn judge<'a>(&self, token: Token, sent: &Sent, owe: &'a Owe) -> (u64, Vec<Missed<'a>>) {
        let got = |book: &Book| book.received.contains_key(&token);
        // A revoked agent's backlog goes with its credential: only what it was sent while it
        // still had one, and had read, counts. An abandoned agent's waits for a session that
        // never came: only what it read counts.
        let owed_to = |book: &Book| (book.revoked.is_none() && !book.abandoned) || got(book);
        let one = |owed: bool, missed: Option<Missed<'a>>| match owed {
            true => (1, missed.into_iter().collect()),
            false => (0, Vec::new()),
        };
        match owe {
            Owe::Members { sender } => {
                let owed: Vec<(usize, &Book)> = self
                    .books
                    .iter()
                    .enumerate()
                    .filter(|(i, b)| i != sender && b.member_at(sent) && owed_to(b))
                    .collect();
                let missed = owed.iter().filter(|(_, b)| !got(b));
                let missed = missed.map(|(i, _)| Missed::Agent(*i)).collect();
                (owed.len() as u64, missed)
            }
            Owe::Agent(i) => {
                let book = &self.books[*i];
                one(owed_to(book), (!got(book)).then_some(Missed::Agent(*i)))
            }
            Owe::Role(role) => {
                let holders: Vec<&Book> = self.books.iter().filter(|b| &b.role == role).collect();
                let took = holders.iter().any(|b| got(b));
                let owed = took || holders.iter().any(|b| b.revoked.is_none() && !b.abandoned);
                one(owed, (!took).then_some(Missed::Role(role)))
            }
        }
    }

    /// How many deliveries of one obligation went unread by agents the soak abandoned (and
    /// were not revoked first), so were not judged.
    fn unjudged(&self, token: Token, sent: &Sent, owe: &Owe) -> u64 {
        let unread = |i: usize, b: &Book| {
            b.abandoned && b.revoked.is_none() && !b.received.contains_key(&token) && {
                match owe {
                    Owe::Members { sender } => i != *sender && b.member_at(sent),
                    Owe::Agent(agent) => i == *agent,
                    Owe::Role(_) => false,
                }
            }
        };
        self.books
            .iter()
            .enumerate()
            .filter(|(i, b)| unread(*i, b))
            .count() as u64
    }

    fn offence(&mut self, what: String) {
        if self.offences.len() < OFFENCES_KEPT {
            self.offences.push(what);
        }
    }

    /// What was read again (in a later session, or twice in one: a duplicate), across a leave
    /// or after a revocation, in words (the first few).
    pub(super) fn offences(&self) -> &[String] {
        &self.offences
    }

    /// What is still missing, for a report of a loss: who misses which message, of what
    /// kind, sent how long after `started`.
    pub(super) fn missing(&self, started: Instant, limit: usize) -> Vec<String> {
        let mut out = Vec::new();
        for (token, sent) in &self.sent {
            let at = sent.at.duration_since(started).as_secs_f64();
            for owe in &sent.owed {
                for missed in self.judge(*token, sent, owe).1 {
                    out.push(match missed {
                        Missed::Agent(agent) => format!(
                            "agent #{agent} (session {}) missed soak#{token} ({}, sent at {at:.1}s)",
                            self.books[agent].session,
                            kind_name(sent.kind),
                        ),
                        Missed::Role(role) => format!(
                            "no holder of role {role} took soak#{token} (task, sent at {at:.1}s)"
                        ),
                    });
                }
            }
            if out.len() >= limit {
                break;
            }
        }
        out.truncate(limit);
        out
    }
}

fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Durable => "durable",
        Kind::Live => "live",
        Kind::Dm => "dm",
        Kind::Mention => "mention",
        Kind::Task => "task",
        Kind::Reply => "reply",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_read_back_from_any_text() {
        let text = format!("{} and {}", tagged(7, "a"), tagged(12, "b"));
        assert_eq!(tokens(&text).collect::<Vec<_>>(), [7, 12]);
        assert_eq!(tokens("no token, soak# none").count(), 0);
    }

    #[test]
    fn a_member_that_misses_a_post_is_a_loss_and_the_sender_is_owed_nothing() {
        let t0 = Instant::now();
        let mut l = Ledger::default();
        let (a, b, c) = (
            l.agent("r", true, t0),
            l.agent("r", true, t0),
            l.agent("r", true, t0),
        );
        let t = t0 + Duration::from_secs(10);
        l.sent(1, Kind::Durable, vec![Owe::Members { sender: a }], t, t);
        l.received(b, 1, true, t0);
        let tally = l.tally(t);
        assert_eq!((tally.owed, tally.lost), (2, 1));
        let missing = l.missing(t0, 10);
        assert_eq!(missing.len(), 1);
        assert!(
            missing[0].starts_with(&format!("agent #{c} (session 0) missed soak#1 (durable")),
            "{missing:?}"
        );
        l.received(c, 1, true, t0);
        assert_eq!(l.tally(t).lost, 0);
    }

    #[test]
    fn a_mention_first_shown_as_history_is_received_and_history_shown_again_is_no_duplicate() {
        let t0 = Instant::now();
        let mut l = Ledger::default();
        let (a, b) = (l.agent("r", false, t0), l.agent("r", false, t0));
        l.sent(1, Kind::Mention, vec![Owe::Agent(b)], t0, t0);
        l.sent(2, Kind::Live, vec![], t0, t0);
        assert_eq!(l.tally(t0).lost, 1);
        l.shown_as_history(b, 1, true, t0);
        l.shown_as_history(b, 1, true, t0);
        // History may show again what was received: not a duplicate.
        l.received(a, 2, true, t0);
        l.shown_as_history(a, 2, true, t0);
        let tally = l.tally(t0);
        assert_eq!((tally.owed, tally.lost, tally.duplicates), (1, 0, 0));
        // But a copy after its message surfaced as history is one (§7: it surfaces once).
        l.received(b, 1, true, t0);
        assert_eq!(l.tally(t0).duplicates, 1);
    }

    #[test]
    fn a_post_from_outside_a_membership_is_owed_to_no_one_and_forbidden() {
        let t0 = Instant::now();
        let mut l = Ledger::default();
        let (a, b) = (l.agent("r", true, t0), l.agent("r", true, t0));
        l.left(
            b,
            t0 + Duration::from_secs(10),
            t0 + Duration::from_secs(10),
        );
        l.sent(
            1,
            Kind::Durable,
            vec![Owe::Members { sender: a }],
            t0 + Duration::from_secs(15),
            t0 + Duration::from_secs(15),
        );
        l.joined(
            b,
            t0 + Duration::from_secs(20),
            t0 + Duration::from_secs(20),
        );
        assert_eq!(l.tally(t0 + Duration::from_secs(30)).owed, 0);
        l.received(b, 1, true, t0);
        assert_eq!(l.tally(t0 + Duration::from_secs(30)).across_leave, 1);
        // Within the margin of the leave: neither owed nor forbidden.
        l.sent(
            2,
            Kind::Durable,
            vec![Owe::Members { sender: a }],
            t0 + Duration::from_secs(11),
            t0 + Duration::from_secs(11),
        );
        l.received(b, 2, true, t0);
        assert_eq!(l.tally(t0 + Duration::from_secs(30)).across_leave, 1);
    }

    #[test]
    fn a_post_stored_while_a_leave_or_a_join_was_under_way_is_judged_neither_way() {
        let t0 = Instant::now();
        let s = |n: u64| t0 + Duration::from_secs(n);
        let mut l = Ledger::default();
        let (a, b) = (l.agent("r", true, t0), l.agent("r", true, t0));
        // The leave is asked at 10 s and done at 20 s; the join asked at 40 s, done at 50 s.
        l.left(b, s(10), s(20));
        l.joined(b, s(40), s(50));
        let owed = || vec![Owe::Members { sender: a }];
        l.sent(1, Kind::Durable, owed(), s(15), s(15)); // while leaving
        l.sent(2, Kind::Durable, owed(), s(21), s(30)); // its ack after 2 s past the leave
        l.sent(3, Kind::Durable, owed(), s(25), s(26)); // surely out
        l.sent(4, Kind::Durable, owed(), s(45), s(45)); // while joining
        l.sent(5, Kind::Durable, owed(), s(60), s(60)); // surely in
        let tally = l.tally(s(100));
        assert_eq!((tally.owed, tally.lost), (1, 1), "only 5 is owed to b");
        for token in [1, 2, 4, 5] {
            l.received(b, token, true, s(70));
        }
        assert_eq!(l.tally(s(100)).across_leave, 0);
        l.received(b, 3, true, s(70));
        assert_eq!(l.tally(s(100)).across_leave, 1);
    }

    #[test]
    fn a_resumed_session_that_reads_again_is_counted_and_a_task_is_owed_once_per_role() {
        let t0 = Instant::now();
        let mut l = Ledger::default();
        let (a, b) = (l.agent("x", false, t0), l.agent("x", false, t0));
        l.sent(1, Kind::Dm, vec![Owe::Agent(b)], t0, t0);
        l.sent(2, Kind::Task, vec![Owe::Role("x".into())], t0, t0);
        l.received(b, 1, true, t0);
        l.received(b, 1, true, t0);
        l.resumed(b, Unconfirmed::default());
        l.received(b, 1, true, t0);
        l.received(a, 2, false, t0);
        l.resumed(a, Unconfirmed::default());
        l.received(a, 2, true, t0);
        let tally = l.tally(t0);
        assert_eq!(
            (tally.duplicates, tally.reread),
            (2, 1),
            "one not acknowledged may come again"
        );
        assert_eq!((tally.owed, tally.lost), (2, 0));
    }

    #[test]
    fn what_a_cut_session_acknowledged_may_come_again_and_what_it_acknowledged_before_may_not() {
        let t0 = Instant::now();
        let mut l = Ledger::default();
        let (a, b) = (l.agent("x", false, t0), l.agent("y", false, t0));
        l.sent(1, Kind::Dm, vec![Owe::Agent(b)], t0, t0);
        l.sent(2, Kind::Dm, vec![Owe::Agent(b)], t0, t0);
        l.received(b, 1, true, t0);
        l.received(b, 2, true, t0 + Duration::from_secs(30));
        // Its credential re-issued at 31 s: the ack of 2 (at 30 s, within the margin) may not
        // have arrived; the ack of 1 had half a minute.
        l.resumed(
            b,
            Unconfirmed {
                since: Some(t0 + Duration::from_secs(31)),
                posts: 0,
            },
        );
        l.received(b, 2, true, t0 + Duration::from_secs(40));
        l.received(b, 1, true, t0 + Duration::from_secs(40));
        let tally = l.tally(t0);
        assert_eq!((tally.reread_unconfirmed, tally.reread), (1, 1));
        // Read a third time in the same session: a duplicate, no longer excused, and named.
        l.received(b, 2, true, t0 + Duration::from_secs(41));
        assert_eq!(l.tally(t0).duplicates, 1);
        assert!(
            l.offences()
                .iter()
                .any(|o| o == "agent #1 got soak#2 (dm) 3 times in session 1"),
            "{:?}",
            l.offences()
        );
        let _ = a;
    }

    #[test]
    fn as_many_durable_posts_as_a_session_could_not_settle_may_come_again_and_no_more() {
        let t0 = Instant::now();
        let mut l = Ledger::default();
        let (a, b) = (l.agent("x", true, t0), l.agent("y", true, t0));
        for token in 1..=3 {
            l.sent(
                token,
                Kind::Durable,
                vec![Owe::Members { sender: a }],
                t0,
                t0,
            );
            l.received(b, token, true, t0);
        }
        l.sent(4, Kind::Dm, vec![Owe::Agent(b)], t0, t0);
        l.received(b, 4, true, t0);
        l.resumed(
            b,
            Unconfirmed {
                since: None,
                posts: 2,
            },
        );
        for token in 1..=4 {
            l.received(b, token, true, t0 + Duration::from_secs(60));
        }
        let tally = l.tally(t0);
        assert_eq!(
            (tally.reread_unconfirmed, tally.reread),
            (2, 2),
            "two posts allowed; the third post and the DM are read again"
        );
    }

    #[test]
    fn a_revoked_agent_is_owed_nothing_it_had_not_read_and_must_not_read_later_sends() {
        let t0 = Instant::now();
        let mut l = Ledger::default();
        let (a, b) = (l.agent("x", false, t0), l.agent("y", false, t0));
        l.sent(1, Kind::Dm, vec![Owe::Agent(b)], t0, t0);
        l.revoked(b, t0 + Duration::from_secs(1));
        l.sent(
            2,
            Kind::Dm,
            vec![Owe::Agent(b)],
            t0 + Duration::from_secs(10),
            t0 + Duration::from_secs(10),
        );
        assert_eq!(l.tally(t0 + Duration::from_secs(20)).lost, 0);
        l.received(b, 2, true, t0);
        assert_eq!(l.tally(t0 + Duration::from_secs(20)).after_revoke, 1);
        let _ = a;
    }

    #[test]
    fn what_an_abandoned_agent_had_not_read_is_not_judged_lost() {
        let t0 = Instant::now();
        let mut l = Ledger::default();
        let (a, b, c) = (
            l.agent("x", true, t0),
            l.agent("y", true, t0),
            l.agent("z", true, t0),
        );
        let t = t0 + Duration::from_secs(10);
        l.sent(1, Kind::Dm, vec![Owe::Agent(b)], t, t);
        l.sent(2, Kind::Durable, vec![Owe::Members { sender: a }], t, t);
        l.received(b, 1, true, t);
        l.abandoned(b);
        let tally = l.tally(t);
        // b read the DM (owed, delivered) and not the post (not judged); c missed the post.
        assert_eq!((tally.owed, tally.lost, tally.unjudged), (2, 1, 1));
        l.received(c, 2, true, t);
        assert_eq!(l.tally(t).lost, 0);
        assert!(l.missing(t0, 10).is_empty());
    }
}
