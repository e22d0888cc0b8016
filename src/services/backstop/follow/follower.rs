//! One member following a feed: what it was offered and has not confirmed, what is due to it
//! (re-authorized per entry, §9 item 5), and its position (every entry up to it confirmed or
//! not due), which is what is saved for it.

use std::collections::{BTreeMap, VecDeque};
use std::time::Instant;

use super::feed::{Entry, Outbox};
use super::{CONFIRM_WITHIN, Handoff, LIVE_FIRST};
use crate::ops::OfferBatch;
use crate::protocol::{Channel, is_covered};
use crate::services::backstop::{Acl, HANDOFF_TIMEOUT};
use crate::space::Identities;
use crate::space::members::{Interval, Members};

/// One member following the feed.
pub(super) struct Follower {
    pub(super) session: String,
    pub(super) generation: u64,
    pub(super) inbox: String,
    acl: Acl,
    /// Whether the read ACL covers the channel, for `acl`'s version.
    covered: bool,
    /// The interval as last read from the registry; `None` once it is gone.
    pub(super) interval: Option<Interval>,
    /// The registry's version it was read at.
    read_at: u64,
    /// Every entry up to this one was offered or was not due.
    processed: u64,
    /// Offered and not confirmed: sequence → when it was last sent.
    pub(super) outstanding: BTreeMap<u64, Instant>,
    /// Due and not offered yet.
    pub(super) fresh: Vec<u64>,
    /// The position last saved in the registry.
    pub(super) saved: u64,
}

impl Follower {
    /// A follower of the session `session`, from where its consumer stood (`handoff`); the
    /// entries its pump handed over and the member has not acknowledged count as offered `now`.
    pub(super) fn new(session: &str, handoff: &Handoff, inbox: String, now: Instant) -> Self {
        Follower {
            session: session.to_owned(),
            generation: handoff.generation,
            inbox,
            acl: Acl::unread(),
            covered: false,
            interval: None,
            read_at: u64::MAX,
            processed: handoff.taken,
            outstanding: handoff.held.iter().map(|seq| (*seq, now)).collect(),
            fresh: Vec::new(),
            saved: handoff.position,
        }
    }

    /// Offers not confirmed [`CONFIRM_WITHIN`] after their entry was read; what is not offered
    /// yet is younger than that.
    pub(super) fn unconfirmed(&self, now: Instant) -> usize {
        self.outstanding
            .values()
            .filter(|read| now.duration_since(**read) >= CONFIRM_WITHIN)
            .count()
    }

    /// Every entry up to this sequence is confirmed or was not due.
    pub(super) fn position(&self) -> u64 {
        self.outstanding
            .keys()
            .next()
            .map_or(self.processed, |first| first - 1)
    }

    /// Re-reads the member's identity and interval, when they changed.
    pub(super) fn refresh(
        &mut self,
        identities: &Identities,
        members: &Members,
        member: &str,
        channel: &Channel,
    ) {
        let acl = self.acl.version;
        self.acl.refresh(identities, member);
        if self.acl.version != acl {
            self.covered = is_covered(&self.acl.read, channel);
        }
        let version = members.version();
        if version != self.read_at {
            self.read_at = version;
            self.interval = members.interval(member, channel.as_str(), self.generation);
        }
    }

    /// Whether `entry` is due to `member` now (§9 item 5): a valid message of someone else,
    /// inside the interval, on a channel the current read ACL covers.
    fn due(&self, member: &str, entry: &Entry) -> bool {
        let Some(sender) = &entry.sender else {
            return false;
        };
        self.acl.record.is_some()
            && self.covered
            && sender != member
            && self
                .interval
                .as_ref()
                .is_some_and(|i| i.contains(entry.seq))
    }
}

/// Considers one entry for one follower: due ones wait to be offered.
pub(super) fn consider(follower: &mut Follower, member: &str, entry: &Entry, now: Instant) {
    if entry.seq <= follower.processed {
        return;
    }
    follower.processed = entry.seq;
    if follower.due(member, entry) {
        follower.fresh.push(entry.seq);
        follower.outstanding.insert(entry.seq, now);
    }
}

/// Fills `outbox` with the follower's fresh offers of what was read at least [`LIVE_FIRST`]
/// ago (the rest waits for the next), and the entries to hand over as copies: those without an
/// id the offers can carry, and offers that waited too long.
pub(super) fn offer(
    follower: &mut Follower,
    member: &str,
    buffer: &VecDeque<Entry>,
    max_payload: usize,
    outbox: &mut Outbox,
) {
    let now = Instant::now();
    let mut carried = Vec::new();
    let mut batch = OfferBatch::default();
    let (ripe, young) = std::mem::take(&mut follower.fresh)
        .into_iter()
        .partition::<Vec<u64>, _>(|seq| {
            follower
                .outstanding
                .get(seq)
                .is_none_or(|read| now.duration_since(*read) >= LIVE_FIRST)
        });
    follower.fresh = young;
    for seq in ripe {
        let Some(entry) = find(buffer, seq) else {
            continue;
        };
        let token = format!("f{seq}");
        let id = entry.id.as_deref().unwrap_or_default();
        if batch.len() + entry.subject.len() + token.len() + id.len() + 3 > max_payload {
            let full = std::mem::take(&mut batch).into_body();
            outbox.offers.push((follower.inbox.clone(), full));
        }
        if !batch.push(&entry.subject, &token, id) {
            carried.push(seq);
        }
    }
    if !batch.is_empty() {
        outbox
            .offers
            .push((follower.inbox.clone(), batch.into_body()));
    }
    carried.extend(
        follower
            .outstanding
            .iter()
            .filter(|(_, sent)| now.duration_since(**sent) >= HANDOFF_TIMEOUT)
            .map(|(seq, _)| *seq),
    );
    if !carried.is_empty() {
        let items = still_due(follower, member, buffer, carried);
        outbox
            .carry
            .push((member.to_owned(), follower.inbox.clone(), items));
    }
}

/// The entries of `seqs` still due to the follower, as (sequence, subject), each marked as
/// sent now (sent again only after [`HANDOFF_TIMEOUT`]). One no longer due is handled for it
/// (as its own consumer acknowledged such an entry away).
pub(super) fn still_due(
    follower: &mut Follower,
    member: &str,
    buffer: &VecDeque<Entry>,
    seqs: Vec<u64>,
) -> Vec<(u64, String)> {
    let now = Instant::now();
    let mut out = Vec::new();
    for seq in seqs {
        match find(buffer, seq).filter(|e| follower.due(member, e)) {
            Some(entry) => {
                follower.outstanding.insert(seq, now);
                out.push((seq, entry.subject.clone()));
            }
            None => {
                follower.outstanding.remove(&seq);
            }
        }
    }
    out
}

/// The buffered entry of sequence `seq`.
fn find(buffer: &VecDeque<Entry>, seq: u64) -> Option<&Entry> {
    buffer
        .binary_search_by_key(&seq, |e| e.seq)
        .ok()
        .and_then(|i| buffer.get(i))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::services::backstop::WINDOW;
    use crate::services::backstop::follow::MAX_OUTSTANDING;

    fn follower() -> Follower {
        Follower {
            session: "s".into(),
            generation: 1,
            inbox: "_INBOX_x.backstop".into(),
            acl: Acl::unread(),
            covered: true,
            interval: None,
            read_at: 0,
            processed: 0,
            outstanding: BTreeMap::new(),
            fresh: Vec::new(),
            saved: 0,
        }
    }

    #[test]
    fn offers_count_as_unconfirmed_only_once_a_member_had_time_to_confirm_them() {
        let mut follower = follower();
        let now = Instant::now();
        // A burst of four windows read just now and offered.
        for seq in 1..=4 * WINDOW as u64 {
            follower.processed = seq;
            follower.outstanding.insert(seq, now);
        }
        assert_eq!(
            follower.unconfirmed(now),
            0,
            "a member that keeps up is not behind"
        );
        assert_eq!(follower.position(), 0);
        // Never confirmed: that member goes back to its consumer.
        assert!(follower.unconfirmed(now + CONFIRM_WITHIN) > MAX_OUTSTANDING);
        // Confirmed up to the last: its position is the last entry.
        follower.outstanding.clear();
        assert_eq!(follower.position(), 4 * WINDOW as u64);
    }

    #[test]
    fn an_entry_is_offered_once_its_live_copy_had_time_to_arrive() {
        let mut follower = follower();
        let now = Instant::now();
        let earlier = now - LIVE_FIRST;
        let buffer: VecDeque<Entry> = (1..=4)
            .map(|seq| Entry {
                seq,
                subject: "cotal.main.chat.UALICE.general".into(),
                sender: Some("UALICE".into()),
                id: Some(format!("id{seq}")),
            })
            .collect();
        for (seq, read) in [(1, earlier), (2, earlier), (3, now), (4, now)] {
            follower.fresh.push(seq);
            follower.outstanding.insert(seq, read);
        }
        let mut outbox = Outbox::default();
        offer(&mut follower, "UBOB", &buffer, 1 << 20, &mut outbox);
        let offered: Vec<String> = outbox
            .offers
            .iter()
            .flat_map(|(_, body)| crate::ops::offers(body).unwrap())
            .map(|o| o.id.to_owned())
            .collect();
        assert_eq!(offered, ["id1", "id2"]);
        assert_eq!(
            follower.fresh,
            [3, 4],
            "read just now: offered the next time"
        );
        assert!(outbox.carry.is_empty());
    }
}
