//! Users and access policies in the spirit of RocketMQ's ACL 2.0.
//!
//! A user has an access key, a secret, and either the admin role (everything is allowed) or a
//! list of rules. A rule allows or denies some actions on the resources a pattern names:
//! `topic:orders` (exact), `topic:orders-*` (prefix), `group:*` (every group), `cluster`, or `*`
//! (everything). A deny that matches wins over any allow; with no matching rule the answer is no.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// What a request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Action {
    /// Send to a topic (and end its transactions, recall its messages).
    Pub,
    /// Consume a topic in a group.
    Sub,
    /// Create a topic or group.
    Create,
    /// Change a topic or group (reset offsets).
    Update,
    /// Delete a topic or group.
    Delete,
    /// Read one resource's status or messages.
    Get,
    /// List resources.
    List,
    /// Cluster operations: leadership, membership, users and policies.
    Admin,
}

impl Action {
    /// Every action, in order.
    pub const ALL: [Action; 8] = [
        Action::Pub,
        Action::Sub,
        Action::Create,
        Action::Update,
        Action::Delete,
        Action::Get,
        Action::List,
        Action::Admin,
    ];
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Action::Pub => "Pub",
            Action::Sub => "Sub",
            Action::Create => "Create",
            Action::Update => "Update",
            Action::Delete => "Delete",
            Action::Get => "Get",
            Action::List => "List",
            Action::Admin => "Admin",
        })
    }
}

impl FromStr for Action {
    type Err = AclError;
    fn from_str(s: &str) -> Result<Self, AclError> {
        Action::ALL
            .into_iter()
            .find(|a| a.to_string().eq_ignore_ascii_case(s))
            .ok_or_else(|| AclError::Action(s.to_string()))
    }
}

/// The kind of a resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Kind {
    /// A topic.
    Topic,
    /// A consumer group.
    Group,
    /// The cluster itself (status, leadership, membership).
    Cluster,
}

/// One resource a request touches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resource<'a> {
    /// Its kind.
    pub kind: Kind,
    /// Its name (empty for the cluster).
    pub name: &'a str,
}

impl<'a> Resource<'a> {
    /// The topic `name`.
    pub fn topic(name: &'a str) -> Self {
        Resource {
            kind: Kind::Topic,
            name,
        }
    }
    /// The group `name`.
    pub fn group(name: &'a str) -> Self {
        Resource {
            kind: Kind::Group,
            name,
        }
    }
    /// The cluster.
    pub fn cluster() -> Self {
        Resource {
            kind: Kind::Cluster,
            name: "",
        }
    }
}

impl fmt::Display for Resource<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            Kind::Topic => write!(f, "topic:{}", self.name),
            Kind::Group => write!(f, "group:{}", self.name),
            Kind::Cluster => f.write_str("cluster"),
        }
    }
}

/// Which resources a rule covers.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Pattern {
    /// Every resource (`*`).
    Any,
    /// The cluster (`cluster`).
    Cluster,
    /// Resources of a kind whose name is exactly this (`topic:orders`).
    Exact(Kind, String),
    /// Resources of a kind whose name starts with this (`topic:orders-*`; `topic:*` is the empty
    /// prefix).
    Prefix(Kind, String),
}

impl Pattern {
    /// Whether the pattern covers `r`.
    pub fn covers(&self, r: &Resource<'_>) -> bool {
        match self {
            Pattern::Any => true,
            Pattern::Cluster => r.kind == Kind::Cluster,
            Pattern::Exact(k, n) => *k == r.kind && n == r.name,
            Pattern::Prefix(k, p) => *k == r.kind && r.name.starts_with(p.as_str()),
        }
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = |k: &Kind| match k {
            Kind::Topic => "topic",
            Kind::Group => "group",
            Kind::Cluster => "cluster",
        };
        match self {
            Pattern::Any => f.write_str("*"),
            Pattern::Cluster => f.write_str("cluster"),
            Pattern::Exact(k, n) => write!(f, "{}:{n}", kind(k)),
            Pattern::Prefix(k, p) => write!(f, "{}:{p}*", kind(k)),
        }
    }
}

impl FromStr for Pattern {
    type Err = AclError;
    fn from_str(s: &str) -> Result<Self, AclError> {
        let bad = |why: &'static str| AclError::Resource {
            text: s.to_string(),
            why,
        };
        match s {
            "*" => return Ok(Pattern::Any),
            "cluster" => return Ok(Pattern::Cluster),
            _ => {}
        }
        let (kind, name) = s
            .split_once(':')
            .ok_or_else(|| bad("expected *, cluster, topic:NAME or group:NAME"))?;
        let kind = match kind {
            "topic" => Kind::Topic,
            "group" => Kind::Group,
            _ => return Err(bad("the kind is not topic or group")),
        };
        if name.is_empty() {
            return Err(bad("the name is empty"));
        }
        let valid = |n: &str| {
            n.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_%|.".contains(&b))
        };
        match name.strip_suffix('*') {
            Some(prefix) if valid(prefix) => Ok(Pattern::Prefix(kind, prefix.to_string())),
            Some(_) => Err(bad(
                "a name may hold letters, digits and -_%|. and end with *",
            )),
            None if valid(name) => Ok(Pattern::Exact(kind, name.to_string())),
            None => Err(bad(
                "a name may hold letters, digits and -_%|. and end with *",
            )),
        }
    }
}

/// Allow or deny.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Effect {
    /// The rule allows its actions.
    Allow,
    /// The rule denies its actions; a matching deny wins.
    Deny,
}

/// One rule: an effect, some actions, a resource pattern.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Rule {
    /// Allow or deny.
    pub effect: Effect,
    /// The actions it covers (never empty).
    pub actions: Vec<Action>,
    /// The resources it covers.
    pub resource: Pattern,
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let effect = match self.effect {
            Effect::Allow => "allow",
            Effect::Deny => "deny",
        };
        let actions: Vec<String> = self.actions.iter().map(Action::to_string).collect();
        write!(f, "{effect} {} on {}", actions.join(","), self.resource)
    }
}

impl Rule {
    /// Parses the actions (`Pub,Sub` or `all`) and the resource of a rule.
    pub fn parse(effect: Effect, actions: &str, resource: &str) -> Result<Rule, AclError> {
        let actions = if actions.eq_ignore_ascii_case("all") {
            Action::ALL.to_vec()
        } else {
            let mut v = actions
                .split(',')
                .map(|a| a.trim().parse())
                .collect::<Result<Vec<Action>, _>>()?;
            v.sort();
            v.dedup();
            v
        };
        if actions.is_empty() {
            return Err(AclError::Action(String::new()));
        }
        Ok(Rule {
            effect,
            actions,
            resource: resource.parse()?,
        })
    }
}

/// The answer for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Allowed (by an admin role or an allow rule).
    Allow,
    /// A deny rule matched.
    Denied,
    /// No rule matched.
    NoRule,
}

/// Decides whether `rules` allow `action` on `resource`: a matching deny wins, then a matching
/// allow, else no.
pub fn decide(admin: bool, rules: &[Rule], action: Action, resource: &Resource<'_>) -> Decision {
    if admin {
        return Decision::Allow;
    }
    let mut allowed = false;
    for r in rules {
        if r.actions.contains(&action) && r.resource.covers(resource) {
            match r.effect {
                Effect::Deny => return Decision::Denied,
                Effect::Allow => allowed = true,
            }
        }
    }
    if allowed {
        Decision::Allow
    } else {
        Decision::NoRule
    }
}

/// A user as stored: the secret is kept to check signatures (HMAC needs it) and never shown.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct User {
    /// The access key (the user's name).
    pub access_key: String,
    /// The secret key.
    pub secret: String,
    /// The admin role: every action on every resource.
    pub admin: bool,
    /// The rules, in order.
    pub rules: Vec<Rule>,
}

impl fmt::Debug for User {
    // The secret never reaches a log line through `{:?}`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("User")
            .field("access_key", &self.access_key)
            .field("secret", &"<hidden>")
            .field("admin", &self.admin)
            .field("rules", &self.rules)
            .finish()
    }
}

/// Checks an access key or a secret a user is created with.
pub fn validate_user(access_key: &str, secret: &str) -> Result<(), AclError> {
    if access_key.is_empty()
        || access_key.len() > 128
        || !access_key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.@".contains(&b))
    {
        return Err(AclError::AccessKey);
    }
    if secret.len() < 8 || secret.len() > 256 || secret.chars().any(char::is_control) {
        return Err(AclError::Secret);
    }
    Ok(())
}

/// A malformed user or rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AclError {
    /// An unknown action.
    #[error(
        "unknown action {0:?}: expected Pub, Sub, Create, Update, Delete, Get, List, Admin or all"
    )]
    Action(String),
    /// A malformed resource pattern.
    #[error("invalid resource {text:?}: {why}")]
    Resource {
        /// The text given.
        text: String,
        /// What is wrong.
        why: &'static str,
    },
    /// A malformed access key.
    #[error("invalid access key: 1 to 128 letters, digits or -_.@")]
    AccessKey,
    /// A secret too short, too long or with control characters (its text is never shown).
    #[error("invalid secret key: 8 to 256 characters, no control characters")]
    Secret,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn rule(effect: Effect, actions: &str, res: &str) -> Rule {
        Rule::parse(effect, actions, res).unwrap()
    }

    #[test]
    fn t1_deny_wins_and_nothing_is_allowed_by_default() {
        let rules = vec![
            rule(Effect::Allow, "Pub,Sub", "topic:orders-*"),
            rule(Effect::Deny, "Pub", "topic:orders-secret"),
            rule(Effect::Allow, "Sub", "group:*"),
        ];
        let d = |a, r: Resource<'_>| decide(false, &rules, a, &r);
        assert_eq!(
            d(Action::Pub, Resource::topic("orders-eu")),
            Decision::Allow
        );
        assert_eq!(
            d(Action::Pub, Resource::topic("orders-secret")),
            Decision::Denied
        );
        assert_eq!(
            d(Action::Sub, Resource::topic("orders-secret")),
            Decision::Allow
        );
        assert_eq!(
            d(Action::Pub, Resource::topic("payments")),
            Decision::NoRule
        );
        assert_eq!(
            d(Action::Create, Resource::topic("orders-eu")),
            Decision::NoRule
        );
        assert_eq!(d(Action::Sub, Resource::group("g1")), Decision::Allow);
        assert_eq!(d(Action::Admin, Resource::cluster()), Decision::NoRule);
        assert_eq!(
            decide(true, &[], Action::Admin, &Resource::cluster()),
            Decision::Allow
        );
    }

    #[test]
    fn t2_patterns_parse_and_print_back() {
        for text in [
            "*",
            "cluster",
            "topic:orders",
            "topic:orders-*",
            "topic:*",
            "group:g.1",
        ] {
            let p: Pattern = text.parse().unwrap();
            assert_eq!(p.to_string(), text);
        }
        for bad in [
            "",
            "topic",
            "topic:",
            "queue:x",
            "topic:a*b",
            "topic:a b",
            "group:*x",
        ] {
            assert!(bad.parse::<Pattern>().is_err(), "{bad}");
        }
        assert_eq!(rule(Effect::Allow, "all", "*").actions.len(), 8);
        assert!(Rule::parse(Effect::Allow, "Pub,Steal", "*").is_err());
        assert_eq!(
            rule(Effect::Deny, "sub,pub,Pub", "*").to_string(),
            "deny Pub,Sub on *"
        );
    }

    #[test]
    fn t3_a_users_secret_never_prints() {
        let u = User {
            access_key: "ak".into(),
            secret: "very-secret".into(),
            admin: false,
            rules: vec![],
        };
        assert!(!format!("{u:?}").contains("very-secret"));
        assert_eq!(validate_user("ak", "short"), Err(AclError::Secret));
        assert_eq!(
            validate_user("a k", "long enough"),
            Err(AclError::AccessKey)
        );
        assert!(!AclError::Secret.to_string().contains("short"));
    }

    fn arb_pattern() -> impl Strategy<Value = Pattern> {
        let kind = prop_oneof![Just(Kind::Topic), Just(Kind::Group)];
        prop_oneof![
            Just(Pattern::Any),
            Just(Pattern::Cluster),
            (kind.clone(), "[a-c]{1,3}").prop_map(|(k, n)| Pattern::Exact(k, n)),
            (kind, "[a-c]{0,2}").prop_map(|(k, n)| Pattern::Prefix(k, n)),
        ]
    }

    fn arb_rule() -> impl Strategy<Value = Rule> {
        (
            prop_oneof![Just(Effect::Allow), Just(Effect::Deny)],
            proptest::sample::subsequence(Action::ALL.to_vec(), 1..=8),
            arb_pattern(),
        )
            .prop_map(|(effect, actions, resource)| Rule {
                effect,
                actions,
                resource,
            })
    }

    proptest! {
        // The matcher agrees with its definition: allowed exactly when some allow rule covers the
        // request and no deny rule does; the order of the rules never matters.
        #[test]
        fn t4_decide_matches_its_definition(
            rules in proptest::collection::vec(arb_rule(), 0..6),
            action_i in 0usize..8,
            kind_i in 0usize..3,
            name in "[a-c]{1,3}",
        ) {
            let action = Action::ALL[action_i];
            let kind = [Kind::Topic, Kind::Group, Kind::Cluster][kind_i];
            let name = if kind == Kind::Cluster { "" } else { name.as_str() };
            let r = Resource { kind, name };
            let hits = |e| rules.iter().any(|x| x.effect == e && x.actions.contains(&action) && x.resource.covers(&r));
            let want = if hits(Effect::Deny) { Decision::Denied } else if hits(Effect::Allow) { Decision::Allow } else { Decision::NoRule };
            prop_assert_eq!(decide(false, &rules, action, &r), want);
            let mut rev = rules.clone();
            rev.reverse();
            prop_assert_eq!(decide(false, &rev, action, &r), want);
        }

        // Printing a pattern and parsing it back gives the same pattern.
        #[test]
        fn t5_pattern_round_trip(p in arb_pattern()) {
            let text = p.to_string();
            prop_assert_eq!(text.parse::<Pattern>(), Ok(p));
        }

        // The parser never panics.
        #[test]
        fn t6_pattern_parser_total(s in ".{0,40}") {
            let _ = s.parse::<Pattern>();
        }
    }
}
