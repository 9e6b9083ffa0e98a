//! `raftmq user add|update|delete|list` and `raftmq acl allow|deny|revoke|list`: users and their
//! rules, which every broker group keeps as replicated state.
//!
//! Each change goes to the leader of every broker group the nameservers know; the command
//! reports each group's answer (text: one line per group; JSON: a `brokers` list, see
//! [`broker_json`]) and exits non-zero, naming the groups and why, if any group refused or did
//! not answer. Nothing is undone on the groups that took the change: running it again once the
//! cause is fixed repairs the others (and reports the groups that had it already).
//!
//! Rules are checked here with `raftmq_security::acl::Rule::parse` before anything is sent. A new
//! user's secret comes from `--secret-key-file`, `--generate` (printed once) or the environment
//! variable `RAFTMQ_NEW_USER_SECRET`; it is never echoed, and no error names it. The caller's own
//! `--access-key`/`--secret-key` (an admin's, when auth is on) sign the requests.
//!
//! JSON (one object per command):
//! - `user add|update|delete`: `{"user","op":"add|update|delete","admin":bool|null,
//!   "brokers":[{"name","ok","code","error"}]}` (`admin` absent for delete, `null` for an update
//!   that kept each group's role), plus `"secret"` with `--generate` when a group took it;
//! - `acl allow|deny|revoke`: `{"user","op":"allow|deny|revoke","rule":{"effect","actions",
//!   "resource"},"brokers":[...]}`;
//! - `user list`, `acl list [ACCESS_KEY]`: `{"users":[{"access_key","admin","from_config",
//!   "rules":[{"effect","actions","resource"}],"brokers":[names],"missing_on":[names]}],
//!   "brokers":[...]}` — a user whose role or rules differ between groups is listed once per
//!   variant, each with the groups holding it.

use std::path::Path;

use anyhow::{Context, Result, anyhow, bail};
use raftmq_client::Error;
use raftmq_client::users::{
    BrokerOutcome, Effect, Rule, UserRule, UserView, generate_secret, merge_users, refusals,
    wire_rule,
};
use raftmq_security::acl::AclError;
use serde_json::{Value, json};

use crate::args::{AclCmd, NewSecretArgs, RuleArgs, RuleEffect, UserCmd};
use crate::connect::Target;
use crate::output::{json_line, table};

/// The environment variable `user add|update` read the new secret from when no flag gives it.
pub const NEW_SECRET_ENV: &str = "RAFTMQ_NEW_USER_SECRET";

pub async fn user(target: &Target, json: bool, cmd: UserCmd) -> Result<()> {
    let env_secret = std::env::var(NEW_SECRET_ENV).ok();
    match cmd {
        UserCmd::Add {
            access_key,
            admin,
            secret,
        } => {
            let secret = new_secret(&access_key, &secret, env_secret)?;
            let outcomes = target
                .admin()?
                .put_user(&access_key, &secret.text, Some(admin), true)
                .await?;
            put_report(json, "add", &access_key, Some(admin), &secret, &outcomes);
            conclude(&format!("user add {access_key}"), &outcomes)
        }
        UserCmd::Update {
            access_key,
            admin,
            no_admin,
            secret,
        } => {
            let role = match (admin, no_admin) {
                (true, _) => Some(true),
                (_, true) => Some(false),
                _ => None,
            };
            let secret = new_secret(&access_key, &secret, env_secret)?;
            let outcomes = target
                .admin()?
                .put_user(&access_key, &secret.text, role, false)
                .await?;
            put_report(json, "update", &access_key, role, &secret, &outcomes);
            conclude(&format!("user update {access_key}"), &outcomes)
        }
        UserCmd::Delete { access_key } => {
            let outcomes = target.admin()?.delete_user(&access_key).await?;
            if json {
                let v =
                    json!({"user": access_key, "op": "delete", "brokers": brokers_json(&outcomes)});
                println!("{}", json_line(&v));
            } else {
                print!(
                    "{}",
                    outcome_lines(&outcomes, &format!("user {access_key} deleted"))
                );
            }
            conclude(&format!("user delete {access_key}"), &outcomes)
        }
        UserCmd::List => {
            let outcomes = target.admin()?.list_users().await?;
            let users = merge_users(&outcomes);
            if json {
                println!("{}", json_line(&list_json(&users, &outcomes)));
            } else {
                print!("{}", users_table(&users));
                print!("{}", list_lines(&outcomes));
            }
            conclude("user list", &outcomes)
        }
    }
}

pub async fn acl(target: &Target, json: bool, cmd: AclCmd) -> Result<()> {
    let (op, args, effect, revoke) = match cmd {
        AclCmd::Allow(a) => ("allow", a, Effect::Allow, false),
        AclCmd::Deny(a) => ("deny", a, Effect::Deny, false),
        AclCmd::Revoke { rule, effect } => {
            let effect = match effect {
                RuleEffect::Allow => Effect::Allow,
                RuleEffect::Deny => Effect::Deny,
            };
            ("revoke", rule, effect, true)
        }
        AclCmd::List { access_key } => return acl_list(target, json, access_key).await,
    };
    let rule = parse_rule(effect, &args)?;
    let outcomes = target
        .admin()?
        .change_rule(&args.access_key, &rule, revoke)
        .await?;
    let ak = &args.access_key;
    if json {
        let v = json!({
            "user": ak, "op": op, "rule": rule_json(&wire_rule(&rule)),
            "brokers": brokers_json(&outcomes),
        });
        println!("{}", json_line(&v));
    } else {
        let done = if revoke {
            format!("rule \"{rule}\" of {ak} revoked")
        } else {
            format!("rule \"{rule}\" of {ak} in place")
        };
        print!("{}", outcome_lines(&outcomes, &done));
    }
    conclude(&format!("acl {op} {ak}"), &outcomes)
}

async fn acl_list(target: &Target, json: bool, access_key: Option<String>) -> Result<()> {
    if let Some(ak) = &access_key {
        raftmq_client::users::check_access_key(ak)?;
    }
    let outcomes = target.admin()?.list_users().await?;
    let users: Vec<UserView> = merge_users(&outcomes)
        .into_iter()
        .filter(|u| access_key.as_ref().is_none_or(|ak| &u.access_key == ak))
        .collect();
    if let Some(ak) = &access_key
        && users.is_empty()
        && outcomes.iter().any(|o| o.is_ok())
    {
        conclude(&format!("acl list {ak}"), &outcomes)?;
        bail!("no broker group has a user {ak:?}");
    }
    if json {
        println!("{}", json_line(&list_json(&users, &outcomes)));
    } else {
        print!("{}", rules_table(&users));
        print!("{}", list_lines(&outcomes));
    }
    match &access_key {
        Some(ak) => conclude(&format!("acl list {ak}"), &outcomes),
        None => conclude("acl list", &outcomes),
    }
}

/// A rule of `acl allow|deny|revoke`, checked as the nodes check it; the error names the flag.
pub fn parse_rule(effect: Effect, args: &RuleArgs) -> Result<Rule> {
    Rule::parse(effect, &args.actions, &args.resource).map_err(|e| match e {
        AclError::Resource { .. } => anyhow!("--resource: {e}"),
        _ => anyhow!("--actions: {e}"),
    })
}

/// A new user's secret and where it came from.
pub struct NewSecret {
    pub text: String,
    /// Made by `--generate`: printed once.
    pub generated: bool,
}

/// The new secret of `user add|update`: `--generate`, else `--secret-key-file`, else `env`
/// (the value of [`NEW_SECRET_ENV`]); checked as the nodes check it. Errors name the source,
/// never the secret.
pub fn new_secret(
    access_key: &str,
    args: &NewSecretArgs,
    env: Option<String>,
) -> Result<NewSecret> {
    if args.generate {
        return Ok(NewSecret {
            text: generate_secret(),
            generated: true,
        });
    }
    let (text, source) = if let Some(path) = &args.secret_key_file {
        (
            read_secret_file(path)?,
            format!("--secret-key-file {}", path.display()),
        )
    } else if let Some(text) = env.filter(|s| !s.is_empty()) {
        (text, NEW_SECRET_ENV.to_string())
    } else {
        bail!(
            "the new secret of {access_key} is missing: give --secret-key-file FILE, set \
             {NEW_SECRET_ENV}, or --generate one"
        );
    };
    raftmq_security::acl::validate_user(access_key, &text).map_err(|e| match e {
        AclError::Secret => anyhow!("{e} (the secret of {source})"),
        _ => anyhow!("{e}"),
    })?;
    Ok(NewSecret {
        text,
        generated: false,
    })
}

/// The one line of a secret file; a final line break is not part of it.
fn read_secret_file(path: &Path) -> Result<String> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read --secret-key-file {}", path.display()))?;
    let line = text
        .strip_suffix('\n')
        .map(|t| t.strip_suffix('\r').unwrap_or(t))
        .unwrap_or(&text);
    if line.contains('\n') {
        bail!(
            "--secret-key-file {} holds more than one line: a secret is one line",
            path.display()
        );
    }
    if line.is_empty() {
        bail!("--secret-key-file {} is empty", path.display());
    }
    Ok(line.to_string())
}

fn put_report(
    json: bool,
    op: &str,
    access_key: &str,
    admin: Option<bool>,
    secret: &NewSecret,
    outcomes: &[BrokerOutcome],
) {
    // A generated secret is shown when some group took it: it is the user's secret there.
    let show_secret = secret.generated && outcomes.iter().any(|o| o.is_ok());
    if json {
        let mut v = json!({
            "user": access_key, "op": op, "admin": admin, "brokers": brokers_json(outcomes),
        });
        if show_secret && let Some(o) = v.as_object_mut() {
            o.insert("secret".into(), json!(secret.text));
        }
        println!("{}", json_line(&v));
        return;
    }
    let role = match admin {
        Some(true) => ", admin",
        Some(false) => ", not admin",
        None => "",
    };
    let done = match op {
        "add" => format!("user {access_key} added{role}"),
        _ => format!("user {access_key} updated{role}"),
    };
    print!("{}", outcome_lines(outcomes, &done));
    if show_secret {
        println!(
            "secret key of {access_key} (shown once, keep it): {}",
            secret.text
        );
    }
}

/// The server's code of a refusal (`INVALID_ARGUMENT`, `FORBIDDEN`, ...); none when no leader
/// answered.
fn code_name(e: &Error) -> Option<&'static str> {
    e.code().map(|c| c.as_str_name())
}

/// Why a group failed, short: `CODE: message` when its leader refused, else the whole error.
fn reason(e: &Error) -> String {
    match e {
        Error::Server { code, message, .. } => format!("{}: {message}", code.as_str_name()),
        other => other.to_string(),
    }
}

/// One group's outcome in JSON: `{"name","ok","code","error"}` (`code` and `error` null when ok;
/// `code` null too when no leader answered).
pub fn broker_json<T>(o: &BrokerOutcome<T>) -> Value {
    match &o.result {
        Ok(_) => json!({"name": o.broker, "ok": true, "code": null, "error": null}),
        Err(e) => json!({
            "name": o.broker, "ok": false, "code": code_name(e), "error": reason(e),
        }),
    }
}

fn brokers_json<T>(outcomes: &[BrokerOutcome<T>]) -> Vec<Value> {
    outcomes.iter().map(broker_json).collect()
}

/// One line per group: `broker-a: <done>`, or `broker-b: refused: CODE: why` / `failed: why`.
fn outcome_lines<T>(outcomes: &[BrokerOutcome<T>], done: &str) -> String {
    outcomes
        .iter()
        .map(|o| match &o.result {
            Ok(_) => format!("{}: {done}\n", o.broker),
            Err(e) => format!("{}: {}\n", o.broker, failure_words(e)),
        })
        .collect()
}

fn failure_words(e: &Error) -> String {
    match code_name(e) {
        Some(_) => format!("refused: {}", reason(e)),
        None => format!("failed: {}", reason(e)),
    }
}

/// One line per group of a list: how many users it has, or why it gave none.
fn list_lines(outcomes: &[BrokerOutcome<Vec<raftmq_client::users::UserInfo>>]) -> String {
    outcomes
        .iter()
        .map(|o| match &o.result {
            Ok(users) if users.len() == 1 => format!("{}: 1 user\n", o.broker),
            Ok(users) => format!("{}: {} users\n", o.broker, users.len()),
            Err(e) => format!("{}: {}\n", o.broker, failure_words(e)),
        })
        .collect()
}

/// Ok when every group took the change (or answered); else one error naming each group that
/// did not, and why.
fn conclude<T>(what: &str, outcomes: &[BrokerOutcome<T>]) -> Result<()> {
    let failed = refusals(outcomes);
    if failed.is_empty() {
        return Ok(());
    }
    let each: Vec<String> = failed
        .iter()
        .map(|(b, e)| format!("{b} ({})", reason(e)))
        .collect();
    bail!(
        "{what} failed on {} of {} broker groups: {}",
        failed.len(),
        outcomes.len(),
        each.join("; ")
    )
}

fn rule_json(r: &UserRule) -> Value {
    json!({"effect": r.effect, "actions": r.actions, "resource": r.resource})
}

/// One user of `user list --json` / `acl list --json`.
pub fn user_json(u: &UserView) -> Value {
    json!({
        "access_key": u.access_key,
        "admin": u.admin,
        "from_config": u.from_config,
        "rules": u.rules.iter().map(rule_json).collect::<Vec<_>>(),
        "brokers": u.brokers,
        "missing_on": u.missing_on,
    })
}

fn list_json(
    users: &[UserView],
    outcomes: &[BrokerOutcome<Vec<raftmq_client::users::UserInfo>>],
) -> Value {
    json!({
        "users": users.iter().map(user_json).collect::<Vec<_>>(),
        "brokers": brokers_json(outcomes),
    })
}

/// `allow Pub,Sub topic:orders*`.
fn rule_words(r: &UserRule) -> String {
    format!("{} {} {}", r.effect, r.actions, r.resource)
}

fn or_dash(list: &[String]) -> String {
    if list.is_empty() {
        "-".into()
    } else {
        list.join(",")
    }
}

fn users_table(users: &[UserView]) -> String {
    let rows: Vec<Vec<String>> = users
        .iter()
        .map(|u| {
            let rules: Vec<String> = u.rules.iter().map(rule_words).collect();
            vec![
                u.access_key.clone(),
                match (u.admin, u.from_config) {
                    (true, true) => "yes (config)".into(),
                    (true, false) => "yes".into(),
                    (false, _) => "no".into(),
                },
                if rules.is_empty() {
                    "-".into()
                } else {
                    rules.join("; ")
                },
                or_dash(&u.brokers),
                or_dash(&u.missing_on),
            ]
        })
        .collect();
    table(
        &["ACCESS_KEY", "ADMIN", "RULES", "BROKERS", "MISSING_ON"],
        &rows,
    )
}

/// One row per rule; an admin's row says it may do everything, a user without rules shows
/// `(none)`: nothing is allowed.
fn rules_table(users: &[UserView]) -> String {
    let mut rows = Vec::new();
    for u in users {
        let brokers = or_dash(&u.brokers);
        if u.admin {
            rows.push(vec![
                u.access_key.clone(),
                "admin".into(),
                "all".into(),
                "*".into(),
                brokers.clone(),
            ]);
        }
        if u.rules.is_empty() && !u.admin {
            rows.push(vec![
                u.access_key.clone(),
                "(none)".into(),
                "-".into(),
                "-".into(),
                brokers.clone(),
            ]);
        }
        for r in &u.rules {
            rows.push(vec![
                u.access_key.clone(),
                r.effect.clone(),
                r.actions.clone(),
                r.resource.clone(),
                brokers.clone(),
            ]);
        }
    }
    table(
        &["ACCESS_KEY", "EFFECT", "ACTIONS", "RESOURCE", "BROKERS"],
        &rows,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use raftmq_client::ErrorCode;
    use raftmq_client::users::UserInfo;

    fn secret_args(file: Option<&Path>, generate: bool) -> NewSecretArgs {
        NewSecretArgs {
            secret_key_file: file.map(Path::to_path_buf),
            generate,
        }
    }

    #[test]
    fn c1_the_secret_comes_from_generate_then_the_file_then_the_environment() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("s");
        std::fs::write(&file, "from-the-file-1\n").unwrap();
        let env = || Some("from-the-env-12".to_string());
        let g = new_secret("alice", &secret_args(None, true), env()).unwrap();
        assert!(g.generated && g.text.len() == 32);
        let f = new_secret("alice", &secret_args(Some(&file), false), env()).unwrap();
        assert_eq!((f.text.as_str(), f.generated), ("from-the-file-1", false));
        let e = new_secret("alice", &secret_args(None, false), env()).unwrap();
        assert_eq!(e.text, "from-the-env-12");
        // CRLF endings are not part of it either.
        std::fs::write(&file, "windows-secret\r\n").unwrap();
        let f = new_secret("alice", &secret_args(Some(&file), false), None).unwrap();
        assert_eq!(f.text, "windows-secret");
    }

    #[test]
    fn c2_a_missing_or_bad_secret_is_one_clear_error_without_the_secret() {
        let e = new_secret("alice", &secret_args(None, false), Some(String::new()))
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("--secret-key-file")
                && e.contains(NEW_SECRET_ENV)
                && e.contains("--generate"),
            "{e}"
        );
        let e = new_secret("alice", &secret_args(None, false), Some("short".into()))
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("invalid secret key") && e.contains(NEW_SECRET_ENV),
            "{e}"
        );
        assert!(!e.contains("short"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("s");
        std::fs::write(&file, "line-one-secret\nline-two-secret\n").unwrap();
        let e = new_secret("alice", &secret_args(Some(&file), false), None)
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("more than one line") && !e.contains("line-one"),
            "{e}"
        );
        std::fs::write(&file, "\n").unwrap();
        let e = new_secret("alice", &secret_args(Some(&file), false), None)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("is empty"), "{e}");
        let e = new_secret(
            "alice",
            &secret_args(Some(&dir.path().join("nope")), false),
            None,
        )
        .err()
        .unwrap();
        assert!(
            format!("{e:#}").contains("cannot read --secret-key-file"),
            "{e:#}"
        );
        let e = new_secret("bad key", &secret_args(None, true), None);
        assert!(e.is_ok(), "the access key is the client's to check");
        let e = new_secret(
            "bad key",
            &secret_args(None, false),
            Some("long-enough-1".into()),
        )
        .err()
        .unwrap()
        .to_string();
        assert!(e.contains("invalid access key"), "{e}");
    }

    #[test]
    fn c3_rules_are_checked_locally_naming_the_flag() {
        let args = |actions: &str, resource: &str| RuleArgs {
            access_key: "alice".into(),
            actions: actions.into(),
            resource: resource.into(),
        };
        let r = parse_rule(Effect::Allow, &args("Pub,Sub", "topic:orders*")).unwrap();
        assert_eq!(r.to_string(), "allow Pub,Sub on topic:orders*");
        let e = parse_rule(Effect::Allow, &args("Pub,Fly", "topic:t"))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("--actions: unknown action \"Fly\""), "{e}");
        let e = parse_rule(Effect::Deny, &args("Pub", "queue:x"))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("--resource: invalid resource \"queue:x\""),
            "{e}"
        );
    }

    fn refused(broker: &str, code: ErrorCode, message: &str) -> BrokerOutcome {
        BrokerOutcome {
            broker: broker.into(),
            result: Err(Error::Server {
                address: "127.0.0.1:9".into(),
                rpc: "PutUser",
                code,
                message: message.into(),
                leader: None,
            }),
        }
    }

    #[test]
    fn c4_each_group_is_reported_and_a_refusal_fails_the_command() {
        let outcomes = vec![
            BrokerOutcome {
                broker: "broker-a".into(),
                result: Ok(()),
            },
            refused(
                "broker-b",
                ErrorCode::InvalidArgument,
                "user \"alice\" exists",
            ),
            BrokerOutcome {
                broker: "broker-c".into(),
                result: Err(Error::Timeout {
                    op: "PutUser to broker broker-c".into(),
                    waited: std::time::Duration::from_secs(10),
                    last: "no answer".into(),
                }),
            },
        ];
        assert_eq!(
            outcome_lines(&outcomes, "user alice added"),
            "broker-a: user alice added\n\
             broker-b: refused: INVALID_ARGUMENT: user \"alice\" exists\n\
             broker-c: failed: PutUser to broker broker-c gave up after 10s: no answer\n"
        );
        assert_eq!(
            brokers_json(&outcomes),
            vec![
                json!({"name": "broker-a", "ok": true, "code": null, "error": null}),
                json!({"name": "broker-b", "ok": false, "code": "INVALID_ARGUMENT",
                       "error": "INVALID_ARGUMENT: user \"alice\" exists"}),
                json!({"name": "broker-c", "ok": false, "code": null,
                       "error": "PutUser to broker broker-c gave up after 10s: no answer"}),
            ]
        );
        let e = conclude("user add alice", &outcomes)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "user add alice failed on 2 of 3 broker groups: broker-b (INVALID_ARGUMENT: user \
             \"alice\" exists); broker-c (PutUser to broker broker-c gave up after 10s: no answer)"
        );
        assert!(conclude("x", &outcomes[..1]).is_ok());
    }

    #[test]
    fn c5_lists_show_roles_rules_and_where_a_user_is_missing() {
        let rule = UserRule {
            effect: "allow".into(),
            actions: "Pub,Sub".into(),
            resource: "topic:orders*".into(),
        };
        let outcomes = vec![
            BrokerOutcome {
                broker: "broker-a".into(),
                result: Ok(vec![
                    UserInfo {
                        access_key: "admin".into(),
                        admin: true,
                        rules: vec![],
                        from_config: true,
                    },
                    UserInfo {
                        access_key: "alice".into(),
                        admin: false,
                        rules: vec![rule.clone()],
                        from_config: false,
                    },
                ]),
            },
            BrokerOutcome {
                broker: "broker-b".into(),
                result: Ok(vec![UserInfo {
                    access_key: "bob".into(),
                    admin: false,
                    rules: vec![],
                    from_config: false,
                }]),
            },
        ];
        let users = merge_users(&outcomes);
        let v = list_json(&users, &outcomes);
        assert_eq!(
            v["users"][1],
            json!({"access_key": "alice", "admin": false, "from_config": false,
                   "rules": [{"effect": "allow", "actions": "Pub,Sub", "resource": "topic:orders*"}],
                   "brokers": ["broker-a"], "missing_on": ["broker-b"]})
        );
        assert_eq!(v["brokers"][1]["ok"], true);
        let t = users_table(&users);
        assert!(t.starts_with("ACCESS_KEY"), "{t}");
        assert!(t.contains("yes (config)"), "{t}");
        assert!(t.contains("allow Pub,Sub topic:orders*"), "{t}");
        let rules = rules_table(&users);
        let lines: Vec<Vec<&str>> = rules
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(lines[1], ["admin", "admin", "all", "*", "broker-a"]);
        assert_eq!(
            lines[2],
            ["alice", "allow", "Pub,Sub", "topic:orders*", "broker-a"]
        );
        assert_eq!(lines[3], ["bob", "(none)", "-", "-", "broker-b"]);
        assert_eq!(
            list_lines(&outcomes),
            "broker-a: 2 users\nbroker-b: 1 user\n"
        );
    }
}
