//! Whom a DM or a task can reach, and what the warden does about one that reaches nobody
//! (see the module doc of [`super`]): a DM to a target that is no minted, unrevoked agent or
//! person, or a task to a role no such agent holds, is purged by its target.

use std::collections::HashSet;

use crate::binding::SpaceNames;
use crate::space::Identities;

/// Who may be addressed: the agents and persons (admins, the machine operator) minted and not
/// revoked, who read their own `dm_<id>`, and the agents' roles.
#[derive(Default)]
pub(super) struct Addressable {
    version: Option<u64>,
    pub(super) inboxes: HashSet<String>,
    pub(super) roles: HashSet<String>,
}

impl Addressable {
    pub(super) fn refresh(&mut self, identities: &Identities) {
        let version = identities.version();
        if self.version == Some(version) {
            return;
        }
        self.inboxes.clear();
        self.roles.clear();
        for record in identities.active().into_iter().chain(identities.builtins()) {
            if record.has_inbox() {
                self.roles.extend(record.role.clone());
                self.inboxes.insert(record.id);
            }
        }
        self.version = Some(version);
    }
}

/// A routing token that can be used inside a purge filter as itself.
fn literal(token: &str) -> bool {
    !token.is_empty() && !token.contains(['*', '>'])
}

/// What the warden does about one DM or task subject it saw.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Nobody can read it: purge everything to this target (the filter).
    Purge(String),
    /// A real DM pair (target, subject).
    Pair(String, String),
    /// A task to a role some agent holds (its pair's subject).
    Task(String),
    /// Nothing to do.
    Keep,
}

pub(super) fn judge(names: &SpaceNames, subject: &str, addressable: &Addressable) -> Verdict {
    let prefix = names.prefix();
    let Some(rest) = subject
        .strip_prefix(prefix.as_str())
        .and_then(|r| r.strip_prefix('.'))
    else {
        return Verdict::Keep;
    };
    let tokens: Vec<&str> = rest.split('.').collect();
    match tokens.as_slice() {
        ["inst", target, sender] if literal(target) && literal(sender) => {
            if addressable.inboxes.contains(*target) {
                Verdict::Pair((*target).to_owned(), subject.to_owned())
            } else {
                Verdict::Purge(names.dms_to(target))
            }
        }
        ["svc", role, sender] if literal(role) && literal(sender) => {
            if addressable.roles.contains(*role) {
                Verdict::Task(subject.to_owned())
            } else {
                Verdict::Purge(names.tasks_for(role))
            }
        }
        _ => Verdict::Keep,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addressable() -> Addressable {
        Addressable {
            version: Some(0),
            inboxes: ["UBOB".to_owned()].into(),
            roles: ["reviewer".to_owned()].into(),
        }
    }

    #[test]
    fn dms_and_tasks_nobody_can_read_are_purged_by_target() {
        let a = addressable();
        let p = &SpaceNames::new("main");
        assert_eq!(
            judge(p, "cotal.main.inst.UBOB.UMAL", &a),
            Verdict::Pair("UBOB".into(), "cotal.main.inst.UBOB.UMAL".into())
        );
        assert_eq!(
            judge(p, "cotal.main.inst.UNOBODY.UMAL", &a),
            Verdict::Purge("cotal.main.inst.UNOBODY.*".into())
        );
        assert_eq!(
            judge(p, "cotal.main.svc.reviewer.UMAL", &a),
            Verdict::Task("cotal.main.svc.reviewer.UMAL".into())
        );
        assert_eq!(
            judge(p, "cotal.main.svc.ghost.UMAL", &a),
            Verdict::Purge("cotal.main.svc.ghost.*".into())
        );
    }

    #[test]
    fn a_wildcard_token_never_becomes_a_purge_filter() {
        let a = addressable();
        for subject in [
            "cotal.main.inst.*.UMAL",
            "cotal.main.inst.>",
            "cotal.main.svc.*.UMAL",
            "cotal.main.inst.UX.UMAL.extra",
            "cotal.other.inst.UX.UMAL",
        ] {
            assert_eq!(
                judge(&SpaceNames::new("main"), subject, &a),
                Verdict::Keep,
                "{subject}"
            );
        }
    }
}
