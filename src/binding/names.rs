//! Names of a space's JetStream objects (§8, Appendix B placeholders). Every name is built
//! from sanitized tokens, so an authenticated id (an nkey) is used unchanged (§8).

/// The control service name of the privileged provisioner: `ctl.<manager>` (§7, Appendix B).
pub const MANAGER_SERVICE: &str = "manager";

/// The JetStream names of one space. The space name must already be a clean token
/// (`profile::validate_space_name`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpaceNames {
    space: String,
}

impl SpaceNames {
    /// Names for `space` (a validated token).
    pub fn new(space: &str) -> Self {
        SpaceNames {
            space: space.to_owned(),
        }
    }

    /// The space token.
    pub fn space(&self) -> &str {
        &self.space
    }

    /// `P = cotal.<space>`
    pub fn prefix(&self) -> String {
        format!("cotal.{}", self.space)
    }

    /// `CHAT_<space>`: multicast history (§8).
    pub fn chat_stream(&self) -> String {
        format!("CHAT_{}", self.space)
    }

    /// `DM_<space>`: unicast (§8).
    pub fn dm_stream(&self) -> String {
        format!("DM_{}", self.space)
    }

    /// `TASK_<space>`: anycast work queue (§8).
    pub fn task_stream(&self) -> String {
        format!("TASK_{}", self.space)
    }

    /// `INBOX_<space>`: the durable-backstop store (`BSTOP`, Appendix B); it holds the
    /// `@mention` copies for targets on `live` channels (§4). Agents have no grant on it.
    pub fn backstop_stream(&self) -> String {
        format!("INBOX_{}", self.space)
    }

    /// The subjects the backstop store captures: `cotal.<space>.backstop.>`.
    pub fn backstop_subjects(&self) -> String {
        format!("cotal.{}.backstop.>", self.space)
    }

    /// What every post's subject begins with: `<P>.chat.` (then the sender, then the
    /// channel, §3).
    pub fn chat_prefix(&self) -> String {
        format!("cotal.{}.chat.", self.space)
    }

    /// What a subscription to the posts on a channel pattern from anyone begins with:
    /// `<P>.chat.*.` (then the pattern).
    pub fn any_sender_prefix(&self) -> String {
        format!("cotal.{}.chat.*.", self.space)
    }

    /// Every post on every channel: `<P>.chat.>`.
    pub fn all_posts(&self) -> String {
        format!("cotal.{}.chat.>", self.space)
    }

    /// What every task's subject begins with: `<P>.svc.` (then the role, then the sender).
    pub fn task_prefix(&self) -> String {
        format!("cotal.{}.svc.", self.space)
    }

    /// A post of `sender` on `channel`: `<P>.chat.<sender>.<channel>` (§3).
    pub fn post(&self, sender: &str, channel: &str) -> String {
        format!("cotal.{}.chat.{sender}.{channel}", self.space)
    }

    /// A DM to `target` from `sender`: `<P>.inst.<target>.<sender>` (§3).
    pub fn dm(&self, target: &str, sender: &str) -> String {
        format!("cotal.{}.inst.{target}.{sender}", self.space)
    }

    /// A task for `role` from `sender`: `<P>.svc.<role>.<sender>` (§3).
    pub fn task(&self, role: &str, sender: &str) -> String {
        format!("cotal.{}.svc.{role}.{sender}", self.space)
    }

    /// The space a subject (or grant) of some space's tree names: `<space>` of
    /// `cotal.<space>.…`.
    pub fn space_of(subject: &str) -> Option<&str> {
        subject.strip_prefix("cotal.")?.split('.').next()
    }

    /// Every post on `channel`, from anyone: `<P>.chat.*.<channel>` (§3).
    pub fn posts_on(&self, channel: &str) -> String {
        format!("cotal.{}.chat.*.{channel}", self.space)
    }

    /// Every DM subject, `<P>.inst.*.*` (target, then sender: §3).
    pub fn dms(&self) -> String {
        format!("cotal.{}.inst.*.*", self.space)
    }

    /// The DMs to `target` from anyone: `<P>.inst.<target>.*`.
    pub fn dms_to(&self, target: &str) -> String {
        format!("cotal.{}.inst.{target}.*", self.space)
    }

    /// The DMs of `sender` to anyone: `<P>.inst.*.<sender>`.
    pub fn dms_from(&self, sender: &str) -> String {
        format!("cotal.{}.inst.*.{sender}", self.space)
    }

    /// Every task subject, `<P>.svc.*.*` (role, then sender: §3).
    pub fn tasks(&self) -> String {
        format!("cotal.{}.svc.*.*", self.space)
    }

    /// The tasks for `role` from anyone: `<P>.svc.<role>.*`.
    pub fn tasks_for(&self, role: &str) -> String {
        format!("cotal.{}.svc.{role}.*", self.space)
    }

    /// The tasks of `sender` for any role: `<P>.svc.*.<sender>`.
    pub fn tasks_from(&self, sender: &str) -> String {
        format!("cotal.{}.svc.*.{sender}", self.space)
    }

    /// Where the `@mention` copies for `target` are stored: `<P>.backstop.<target>.m`.
    pub fn mentions_for(&self, target: &str) -> String {
        format!("cotal.{}.backstop.{target}.m", self.space)
    }

    /// Every stored copy for `member`: `<P>.backstop.<member>.>`.
    pub fn mentions_of(&self, member: &str) -> String {
        format!("cotal.{}.backstop.{member}.>", self.space)
    }

    /// Every request to the manager, from anyone: `<P>.ctl.manager.*` (§7).
    pub fn manager_requests(&self) -> String {
        format!("cotal.{}.ctl.{MANAGER_SERVICE}.*", self.space)
    }

    /// Where `id`'s requests reach the manager: `<P>.ctl.manager.<id>` (§7).
    pub fn manager_control(&self, id: &str) -> String {
        format!("cotal.{}.ctl.{MANAGER_SERVICE}.{id}", self.space)
    }

    /// `cotal_presence_<space>` (§6).
    pub fn presence_bucket(&self) -> String {
        format!("cotal_presence_{}", self.space)
    }

    /// `cotal_channels_<space>`: the channel registry (§7).
    pub fn channels_bucket(&self) -> String {
        format!("cotal_channels_{}", self.space)
    }

    /// `cotal_membership_<space>`: the derived membership feed (§8, display only).
    pub fn membership_bucket(&self) -> String {
        format!("cotal_membership_{}", self.space)
    }

    /// `cotal_members_<space>`: the privileged members registry (durable memberships with
    /// join/leave cursors, §7). Written only by the provisioner.
    pub fn members_bucket(&self) -> String {
        format!("cotal_members_{}", self.space)
    }

    /// The stream behind a KV bucket: `KV_<bucket>`.
    pub fn kv_stream(bucket: &str) -> String {
        format!("KV_{bucket}")
    }

    /// The subject of `key` in a KV bucket: `$KV.<bucket>.<key>`; every key's with `>`.
    pub fn kv_subject(bucket: &str, key: &str) -> String {
        format!("$KV.{bucket}.{key}")
    }
}

/// `dm_<id>`: an instance's unicast durable (§8).
pub fn dm_durable(id: &str) -> String {
    format!("dm_{id}")
}

/// `svc_<role>`: a role's anycast durable, shared by every holder of the role (§8).
pub fn svc_durable(role: &str) -> String {
    format!("svc_{role}")
}

/// `bk_<member>_<generation>_<first 12 hex of sha256(channel)>`: the trusted reader's
/// consumer of one membership interval (§7, §8).
pub fn interval_consumer(member: &str, channel: &str, generation: u64) -> String {
    use sha2::Digest;
    let hash = sha2::Sha256::digest(channel.as_bytes());
    let hex: String = hash.iter().take(6).map(|b| format!("{b:02x}")).collect();
    format!("bk_{member}_{generation}_{hex}")
}

/// `bkm_<member>`: the trusted reader's consumer of the member's `@mention` copies.
pub fn mention_consumer(member: &str) -> String {
    format!("bkm_{member}")
}

/// `chathist_<id>`: an instance's transient single-filter history consumer (§8).
pub fn chat_history_consumer(id: &str) -> String {
    format!("chathist_{id}")
}

/// JetStream's audit of every API request in an account, naming the client that made it: how
/// the consumer guard attributes a consumer to the identity that created it.
pub const API_AUDIT_ADVISORIES: &str = "$JS.EVENT.ADVISORY.API";

/// The advisories of every consumer of `stream` that is deleted (by its client, by its
/// inactivity threshold, or by the guard).
pub fn consumer_deleted_advisories(stream: &str) -> String {
    format!("$JS.EVENT.ADVISORY.CONSUMER.DELETED.{stream}.*")
}

/// How a refusal for a held sender begins (the warden's holds, the consumer guard's notices):
/// the client recognizes the kind by it and finds the reason after it.
pub const HELD: &str = "held: ";

/// What every subject of `id`'s own inbox begins with: `_INBOX_<id>.` (Appendix B `inbox`);
/// a reply to `id`, and a push delivery it may ask for, go there and nowhere else.
pub fn inbox_of(id: &str) -> String {
    format!("_INBOX_{id}.")
}

/// The subject durable copies reach a member on: `_INBOX_<id>.backstop` (§8 trusted reader).
pub fn backstop_inbox(id: &str) -> String {
    format!("_INBOX_{id}.backstop")
}

/// Where an identity is told why the consumers it creates are deleted: its own inbox, the one
/// subject every profile may read (Appendix B `inbox`).
pub fn guard_notice(id: &str) -> String {
    format!("_INBOX_{id}.cotal.held")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_section_8() {
        let n = SpaceNames::new("main");
        assert_eq!(n.prefix(), "cotal.main");
        assert_eq!(n.chat_stream(), "CHAT_main");
        assert_eq!(n.dm_stream(), "DM_main");
        assert_eq!(n.task_stream(), "TASK_main");
        assert_eq!(n.backstop_stream(), "INBOX_main");
        assert_eq!(n.presence_bucket(), "cotal_presence_main");
        assert_eq!(n.channels_bucket(), "cotal_channels_main");
        assert_eq!(n.membership_bucket(), "cotal_membership_main");
        assert_eq!(
            SpaceNames::kv_stream(&n.presence_bucket()),
            "KV_cotal_presence_main"
        );
        assert_eq!(dm_durable("UABC"), "dm_UABC");
        assert_eq!(svc_durable("reviewer"), "svc_reviewer");
        assert_eq!(chat_history_consumer("UABC"), "chathist_UABC");
    }

    #[test]
    fn consumer_names_are_valid_and_distinct() {
        let id = "UAQGWOEVJKMIO4WXSYOTLARXYOZTCXFK67JASEH6AFFFYK6FOPSKQCAD";
        let a = interval_consumer(id, "team.backend", 1);
        let b = interval_consumer(id, "team.backend", 2);
        let c = interval_consumer(id, "team_backend", 1);
        assert_ne!(a, b);
        assert_ne!(a, c);
        for name in [&a, &mention_consumer(id)] {
            assert!(
                name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'),
                "{name}"
            );
            assert!(name.len() < 128, "{name}");
        }
    }

    #[test]
    fn the_prefixes_begin_what_they_say() {
        let n = SpaceNames::new("main");
        let post = n.post("UA", "team.backend");
        assert_eq!(post, "cotal.main.chat.UA.team.backend");
        assert!(post.starts_with(&n.chat_prefix()));
        assert_eq!(
            n.posts_on("team.backend")
                .strip_prefix(&n.any_sender_prefix()),
            Some("team.backend")
        );
        assert!(n.task("reviewer", "UA").starts_with(&n.task_prefix()));
        assert_eq!(n.dm("UB", "UA"), "cotal.main.inst.UB.UA");
        assert_eq!(SpaceNames::space_of("cotal.main.chat.>"), Some("main"));
        assert_eq!(SpaceNames::space_of("$KV.x.y"), None);
    }
}
