//! How the trusted reader's copies and offers travel to a member (§8): batches framed on the
//! member's backstop inbox, and the marker that says a session's backlog was all handed over.

/// Header of a stored `@mention` copy: the chat subject the message was published on (§3),
/// which the reader hands over with it.
pub const COPY_SUBJECT: &str = "Cotal-Subject";

/// Durable copies on their way to a member: one message on its inbox carries every copy the
/// trusted reader had at hand, so a catch-up moves hundreds of copies per message through the
/// broker instead of one. Each copy is framed as `<subject> <token> <length>\n<payload>`: the
/// chat subject the message was published on (§3, which the member validates the copy
/// against like any delivery), the token it acknowledges with `backstop-ack`, and the original
/// payload, unchanged. Subjects and tokens hold no space or line end, so nothing is escaped.
#[derive(Debug, Default)]
pub struct CopyBatch {
    body: Vec<u8>,
    copies: usize,
}

impl CopyBatch {
    /// Adds one copy.
    pub fn push(&mut self, subject: &str, token: &str, payload: &[u8]) {
        self.body.reserve(Self::framed_len(subject, token, payload));
        self.body.extend_from_slice(subject.as_bytes());
        self.body.push(b' ');
        self.body.extend_from_slice(token.as_bytes());
        self.body.push(b' ');
        self.body
            .extend_from_slice(payload.len().to_string().as_bytes());
        self.body.push(b'\n');
        self.body.extend_from_slice(payload);
        self.copies += 1;
    }

    /// The bytes one copy takes in a batch.
    pub fn framed_len(subject: &str, token: &str, payload: &[u8]) -> usize {
        subject.len() + token.len() + payload.len().to_string().len() + payload.len() + 3
    }

    /// The batch's size in bytes.
    pub fn len(&self) -> usize {
        self.body.len()
    }

    /// How many copies it holds.
    pub fn copies(&self) -> usize {
        self.copies
    }

    /// Whether it holds no copy.
    pub fn is_empty(&self) -> bool {
        self.copies == 0
    }

    /// The message body.
    pub fn into_body(self) -> Vec<u8> {
        self.body
    }
}

/// One copy of a [`CopyBatch`], borrowed from the received body.
#[derive(Debug, PartialEq, Eq)]
pub struct Copy<'a> {
    /// The chat subject it was published on.
    pub subject: &'a str,
    /// What `backstop-ack` acknowledges.
    pub token: &'a str,
    /// The original payload.
    pub payload: &'a [u8],
}

/// A batch body that is not a sequence of framed copies.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("a malformed batch of durable copies: {0}")]
pub struct CopyBatchError(&'static str);

/// The copies of a batch body, in order.
pub fn copies(body: &[u8]) -> Result<Vec<Copy<'_>>, CopyBatchError> {
    let mut out = Vec::new();
    let mut rest = body;
    while !rest.is_empty() {
        let end = rest
            .iter()
            .position(|b| *b == b'\n')
            .ok_or(CopyBatchError("a frame without its line end"))?;
        let head = std::str::from_utf8(&rest[..end])
            .map_err(|_| CopyBatchError("a frame head that is not UTF-8"))?;
        let mut fields = head.split(' ');
        let (Some(subject), Some(token), Some(len), None) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            return Err(CopyBatchError(
                "a frame head without subject, token and length",
            ));
        };
        let len: usize = len
            .parse()
            .map_err(|_| CopyBatchError("a frame length that is not a number"))?;
        let payload = rest[end + 1..]
            .get(..len)
            .ok_or(CopyBatchError("a frame shorter than its length"))?;
        out.push(Copy {
            subject,
            token,
            payload,
        });
        rest = &rest[end + 1 + len..];
    }
    Ok(out)
}

/// Header of a message on the backstop inbox whose body is not a [`CopyBatch`]: its value
/// says what it is.
pub const BATCH_KIND: &str = "Cotal-Batch";

/// [`BATCH_KIND`]'s value for an [`OfferBatch`].
pub const OFFERS: &str = "offers";

/// [`BATCH_KIND`]'s value for a consumer's word that what it held when the session started has
/// been handed over (or as much as its window lets out before acknowledgements): the body is
/// `<session> <consumer>`. It follows that consumer's copies on the same inbox, so a member
/// that reads it has every one of them.
pub const CAUGHT_UP: &str = "caught-up";

/// The body of a [`CAUGHT_UP`] message.
pub fn caught_up_body(session: &str, consumer: &str) -> String {
    format!("{session} {consumer}")
}

/// Reads a [`CAUGHT_UP`] body: (session, consumer); `None` when it is not one.
pub fn caught_up(body: &[u8]) -> Option<(&str, &str)> {
    let text = std::str::from_utf8(body).ok()?;
    let (session, consumer) = text.split_once(' ')?;
    (!session.is_empty() && !consumer.is_empty() && !consumer.contains(' '))
        .then_some((session, consumer))
}

/// [`BATCH_KIND`]'s value for a [`Range`]: entries of a durable channel the member reads
/// itself.
pub const RANGE: &str = "range";

/// A member's backlog on one durable channel that it reads itself, through its own history
/// consumer (§8 `chathist_<id>`, which the broker bounds to its read ACL), instead of having the
/// trusted reader carry each entry's content to it: the reader re-authorized the whole range
/// (the member's current read ACL covers the channel; every entry is of its open membership
/// interval) before granting it. It names the entries of `subject` after stream sequence
/// `after` up to `last`, how many there were when it was granted (`count`: fewer if the stream
/// dropped some since, by its limits), and a `grant` the member's progress tokens
/// ([`range_token`]) name. Body: `<subject> <after> <last> <count> <grant>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range<'a> {
    /// The channel's post subject (`cotal.<space>.chat.*.<channel>`).
    pub subject: &'a str,
    /// The stream sequence the range starts after.
    pub after: u64,
    /// The stream sequence it ends at.
    pub last: u64,
    /// How many entries of the channel it holds.
    pub count: u64,
    /// What the member's progress tokens name.
    pub grant: u64,
}

impl Range<'_> {
    /// The message body.
    pub fn to_body(&self) -> String {
        let Range {
            subject,
            after,
            last,
            count,
            grant,
        } = self;
        format!("{subject} {after} {last} {count} {grant}")
    }

    /// Reads a range body; `None` when it is not one.
    pub fn parse(body: &[u8]) -> Option<Range<'_>> {
        let text = std::str::from_utf8(body).ok()?;
        let mut fields = text.split(' ');
        let range = Range {
            subject: fields.next().filter(|s| !s.is_empty())?,
            after: fields.next()?.parse().ok()?,
            last: fields.next()?.parse().ok()?,
            count: fields.next()?.parse().ok()?,
            grant: fields.next()?.parse().ok()?,
        };
        fields.next().is_none().then_some(range)
    }
}

/// What a member says of a [`Range`] it was granted, in a `backstop-ack` token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RangeProgress {
    /// Every entry of the range up to stream sequence `position` is handled, and `handled`
    /// of its entries in all (those the stream no longer holds included).
    Handled {
        /// The stream sequence up to which every entry is handled.
        position: u64,
        /// How many of the range's entries are handled.
        handled: u64,
    },
    /// The member could not read the range: the reader hands its entries over as copies.
    Declined,
}

/// The `backstop-ack` token of `progress` on `grant`: `r<grant>.<position>.<handled>`, or
/// `r<grant>.x` when declined.
pub fn range_token(grant: u64, progress: RangeProgress) -> String {
    match progress {
        RangeProgress::Handled { position, handled } => format!("r{grant}.{position}.{handled}"),
        RangeProgress::Declined => format!("r{grant}.x"),
    }
}

/// Reads a [`range_token`]: the grant and what it says.
pub fn range_progress(token: &str) -> Option<(u64, RangeProgress)> {
    let rest = token.strip_prefix('r')?;
    let (grant, rest) = rest.split_once('.')?;
    let grant = grant.parse().ok()?;
    if rest == "x" {
        return Some((grant, RangeProgress::Declined));
    }
    let (position, handled) = rest.split_once('.')?;
    let progress = RangeProgress::Handled {
        position: position.parse().ok()?,
        handled: handled.parse().ok()?,
    };
    Some((grant, progress))
}

/// Entries offered to a member that follows its channel, without their content: each framed
/// as `<subject> <token> <id>\n`, the chat subject (which names the sender, §3), the token the
/// member acknowledges (`backstop-ack`, as for a copy) or asks the content of
/// (`backstop-want`), and the message's `id`, validated by the trusted reader. (sender, `id`)
/// is what the member deduplicates by, so it knows without the content whether it surfaced the
/// message already. An offer on the subject of the offer before it leaves the subject out
/// (` <token> <id>\n`): a sender's run of messages names its subject once, where it was most
/// of each offer's bytes (a subject is about 80, a token and an id about 45). A reader that
/// does not know the shortened form takes the subject as empty, finds no sender in it, and asks
/// for the content: slower, nothing lost.
#[derive(Debug, Default)]
pub struct OfferBatch {
    body: Vec<u8>,
    /// Where the subject last written lies in `body`.
    subject: std::ops::Range<usize>,
}

impl OfferBatch {
    /// Adds one offer; false (nothing added) when the id holds a space or a line end, which
    /// the framing cannot carry: such an entry is handed over as a copy instead.
    pub fn push(&mut self, subject: &str, token: &str, id: &str) -> bool {
        if id.is_empty() || id.contains([' ', '\n', '\r']) {
            return false;
        }
        if self.body.get(self.subject.clone()) != Some(subject.as_bytes()) {
            let start = self.body.len();
            self.body.extend_from_slice(subject.as_bytes());
            self.subject = start..self.body.len();
        }
        for part in [" ", token, " ", id, "\n"] {
            self.body.extend_from_slice(part.as_bytes());
        }
        true
    }

    /// The batch's size in bytes.
    pub fn len(&self) -> usize {
        self.body.len()
    }

    /// Whether it holds no offer.
    pub fn is_empty(&self) -> bool {
        self.body.is_empty()
    }

    /// The message body.
    pub fn into_body(self) -> Vec<u8> {
        self.body
    }
}

/// One offer of an [`OfferBatch`], borrowed from the received body.
#[derive(Debug, PartialEq, Eq)]
pub struct Offer<'a> {
    /// The chat subject it was published on.
    pub subject: &'a str,
    /// What `backstop-ack` acknowledges and `backstop-want` asks for.
    pub token: &'a str,
    /// The message's `id`.
    pub id: &'a str,
}

/// The offers of a batch body, in order, each with its subject (an offer that leaves it out
/// has the one of the offer before it).
pub fn offers(body: &[u8]) -> Result<Vec<Offer<'_>>, CopyBatchError> {
    let text =
        std::str::from_utf8(body).map_err(|_| CopyBatchError("offers that are not UTF-8"))?;
    let mut last = "";
    text.lines()
        .map(|line| {
            let mut fields = line.split(' ');
            match (fields.next(), fields.next(), fields.next(), fields.next()) {
                (Some(subject), Some(token), Some(id), None) if !id.is_empty() => {
                    if !subject.is_empty() {
                        last = subject;
                    }
                    if last.is_empty() {
                        return Err(CopyBatchError("an offer without a subject before it"));
                    }
                    Ok(Offer {
                        subject: last,
                        token,
                        id,
                    })
                }
                _ => Err(CopyBatchError("an offer without subject, token and id")),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_and_its_progress_read_back_and_nothing_else_reads_as_them() {
        let range = Range {
            subject: "cotal.main.chat.*.general",
            after: 41,
            last: 20_000,
            count: 10_000,
            grant: 3,
        };
        assert_eq!(Range::parse(range.to_body().as_bytes()), Some(range));
        for bad in [
            "",
            "s 1 2 3",
            "s 1 2 3 4 5",
            " 1 2 3 4",
            "s x 2 3 4",
            "s 1 2 3 -4",
        ] {
            assert_eq!(Range::parse(bad.as_bytes()), None, "{bad:?}");
        }
        for progress in [
            RangeProgress::Handled {
                position: 90,
                handled: 12,
            },
            RangeProgress::Declined,
        ] {
            assert_eq!(
                range_progress(&range_token(7, progress)),
                Some((7, progress))
            );
        }
        for bad in ["c12", "r1", "r1.2", "r1.2.", "rx.1.2", "r1.y", "r1.2.3.4"] {
            assert_eq!(range_progress(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_batch_of_copies_round_trips_whatever_the_payload_holds() {
        let mut batch = CopyBatch::default();
        let payloads: [&[u8]; 3] = [b"{\"a\": 1}", b"", b"line\nbreaks and spaces \n"];
        for (i, p) in payloads.iter().enumerate() {
            batch.push("cotal.main.chat.UA.general", &format!("c{i}"), p);
        }
        assert_eq!(batch.copies(), 3);
        let expected: usize = payloads
            .iter()
            .enumerate()
            .map(|(i, p)| CopyBatch::framed_len("cotal.main.chat.UA.general", &format!("c{i}"), p))
            .sum();
        assert_eq!(batch.len(), expected);
        let body = batch.into_body();
        let read = copies(&body).unwrap();
        assert_eq!(read.len(), 3);
        for (i, copy) in read.iter().enumerate() {
            assert_eq!(copy.subject, "cotal.main.chat.UA.general");
            assert_eq!(copy.token, format!("c{i}"));
            assert_eq!(copy.payload, payloads[i]);
        }
        assert_eq!(copies(b"").unwrap(), []);
    }

    #[test]
    fn a_malformed_batch_is_refused() {
        for body in [
            &b"cotal.main.chat.UA.general c1 5"[..],
            b"cotal.main.chat.UA.general c1\n{}",
            b"cotal.main.chat.UA.general c1 x\n{}",
            b"cotal.main.chat.UA.general c1 9\n{}",
            b"a b c d\n",
        ] {
            assert!(copies(body).is_err(), "{body:?}");
        }
    }

    #[test]
    fn offers_round_trip_and_an_id_the_framing_cannot_carry_is_refused() {
        let (a, b) = ("cotal.main.chat.UA.general", "cotal.main.chat.UB.general");
        let mut batch = OfferBatch::default();
        assert!(batch.push(a, "f7", "m-1"));
        assert!(batch.push(a, "f8", "m-2"));
        assert!(batch.push(b, "f9", "m-3"));
        for id in ["", "a b", "a\nb"] {
            assert!(!batch.push(b, "f10", id), "{id:?}");
        }
        assert!(batch.push(a, "f11", "m-4"));
        let body = batch.into_body();
        // A run of one sender's offers names its subject once.
        assert_eq!(
            body,
            format!("{a} f7 m-1\n f8 m-2\n{b} f9 m-3\n{a} f11 m-4\n").into_bytes()
        );
        let offer = |subject, token, id| Offer { subject, token, id };
        assert_eq!(
            offers(&body).unwrap(),
            [
                offer(a, "f7", "m-1"),
                offer(a, "f8", "m-2"),
                offer(b, "f9", "m-3"),
                offer(a, "f11", "m-4"),
            ]
        );
        assert_eq!(offers(b"").unwrap(), []);
        for body in [&b"a b\n"[..], b"a b c d\n", b"a b \n", b"\xff", b" b c\n"] {
            assert!(offers(body).is_err(), "{body:?}");
        }
    }
}
