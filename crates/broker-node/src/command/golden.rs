//! Golden bytes: today's encodings of every replicated command, every reply and a broker-state
//! snapshot, frozen as hex literals taken from the code before format versions were added. Each
//! test encodes a fixed value and compares it with the literal, then decodes the literal back. A
//! failure here means data already on disks (or in flight between nodes of a mixed cluster) would no
//! longer read: do not update a literal, add a variant or a format version instead.

use super::*;
use crate::state::BrokerState;
use raftmq_raft_log::StateMachine;

pub(crate) fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub(crate) fn unhex(s: &str) -> Vec<u8> {
    let s: String = s.split_whitespace().collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex literal"))
        .collect()
}

fn send() -> Command {
    Command::Send {
        topic: "orders".into(),
        queue: 3,
        producer_id: 0x1234_5678_9abc,
        sequence: 300,
        timestamp_ms: 1_700_000_000_000,
        messages: vec![
            StoredBody {
                key: "k1".into(),
                tag: "tagA".into(),
                body: bytes::Bytes::from_static(b"hello"),
                properties: vec![("p".into(), "v".into()), ("trace".into(), "x1".into())],
            },
            StoredBody {
                key: String::new(),
                tag: String::new(),
                body: bytes::Bytes::from_static(&[0, 1, 2, 255]),
                properties: vec![],
            },
        ],
    }
}

/// Every command variant, in tag order, with its frozen encoding.
fn commands() -> Vec<(Command, &'static str)> {
    vec![
        (
            Command::CreateTopic {
                name: "orders".into(),
                queues: 8,
                update: true,
            },
            "00066f72646572730801",
        ),
        (
            Command::DeleteTopic {
                name: "orders".into(),
            },
            "01066f7264657273",
        ),
        (
            send(),
            "02066f726465727303bcb5e2b3c5c604ac0280d095ffbc3102026b3104746167410568656c6c6f0201700176057472616365027831000004000102ff00",
        ),
        (
            Command::CommitOffset {
                group: "g1".into(),
                topic: "orders".into(),
                queue: 3,
                offset: 1000,
            },
            "03026731066f726465727303e807",
        ),
        (
            Command::Trim {
                upto_log_index: 123_456,
            },
            "04c0c407",
        ),
        (
            Command::ConfigureTopic {
                name: "orders".into(),
                queues: 8,
                update: false,
                message_type: 1,
            },
            "05066f7264657273080001",
        ),
        (
            Command::UpsertGroup {
                name: "g1".into(),
                max_attempts: 3,
                retry_delays_ms: vec![1000, 5000],
                fifo: true,
                update: true,
            },
            "060267310302e80788270101",
        ),
        (Command::DeleteGroup { name: "g1".into() }, "07026731"),
        (
            Command::Pop {
                group: "g1".into(),
                topic: "orders".into(),
                now_ms: 1_700_000_000_000,
                invisible_ms: 30_000,
                create_group: true,
                picks: vec![(0, 5), (1, 7)],
                advance: vec![(1, 9)],
            },
            "08026731066f726465727380d095ffbc31b0ea01010200050107010109",
        ),
        (
            Command::Ack {
                group: "g1".into(),
                topic: "orders".into(),
                now_ms: 1_700_000_000_001,
                handles: vec![(1, 7, 42)],
            },
            "09026731066f726465727381d095ffbc310101072a",
        ),
        (
            Command::ChangeInvisible {
                group: "g1".into(),
                topic: "orders".into(),
                queue: 1,
                offset: 7,
                issued: 42,
                invisible_ms: 10_000,
                now_ms: 1_700_000_000_002,
            },
            "0a026731066f726465727301072a904e82d095ffbc31",
        ),
        (
            Command::DeadLetter {
                group: "g1".into(),
                topic: "orders".into(),
                queue: 1,
                offset: 7,
                issued: 0,
                timestamp_ms: 1_700_000_000_003,
                messages: vec![StoredBody {
                    key: "k".into(),
                    tag: "t".into(),
                    body: bytes::Bytes::from_static(b"x"),
                    properties: vec![("a".into(), "b".into())],
                }],
            },
            "0b026731066f726465727301070083d095ffbc3101016b017401780101610162",
        ),
        (
            Command::SendOnce {
                topic: "orders".into(),
                queue: 3,
                producer_id: 9,
                sequence: 10,
                timestamp_ms: 1_700_000_000_004,
                id_property: "id".into(),
                messages: vec![StoredBody {
                    key: String::new(),
                    tag: "t".into(),
                    body: bytes::Bytes::from_static(b"x"),
                    properties: vec![("id".into(), "M1".into())],
                }],
            },
            "0c066f726465727303090a84d095ffbc3102696401000174017801026964024d31",
        ),
        (
            Command::ResetPop {
                group: "g1".into(),
                topic: "orders".into(),
                queue: 2,
                offset: 300,
            },
            "0d026731066f726465727302ac02",
        ),
        (
            Command::Schedule {
                topic: "orders".into(),
                queue: 1,
                producer_id: 9,
                sequence: 10,
                timestamp_ms: 1_700_000_000_000,
                id_property: "id".into(),
                deliver_at_ms: vec![1_700_000_030_000],
                replaces: vec![(77, 2)],
                messages: vec![StoredBody {
                    key: String::new(),
                    tag: "t".into(),
                    body: bytes::Bytes::from_static(b"x"),
                    properties: vec![("id".into(), "M1".into())],
                }],
            },
            "0e066f726465727301090a80d095ffbc3102696401b0ba97ffbc31014d0201000174017801026964024d31",
        ),
        (
            Command::Deliver {
                topic: "orders".into(),
                queue: 1,
                now_ms: 1_700_000_030_005,
                due: vec![(1_700_000_030_000, 88, 0)],
                messages: vec![StoredBody {
                    key: String::new(),
                    tag: "t".into(),
                    body: bytes::Bytes::from_static(b"x"),
                    properties: vec![],
                }],
            },
            "0f066f726465727301b5ba97ffbc3101b0ba97ffbc31580001000174017800",
        ),
        (
            Command::Recall {
                topic: "orders".into(),
                queue: 1,
                deliver_at_ms: 1_700_000_030_000,
                log_index: 88,
                position: 0,
            },
            "10066f726465727301b0ba97ffbc315800",
        ),
        (
            Command::PopFifo {
                group: "g1".into(),
                topic: "orders".into(),
                now_ms: 1000,
                invisible_ms: 30_000,
                create_group: false,
                picks: vec![(1, 7, 0xdead_beef)],
                advance: vec![(1, 7)],
            },
            "11026731066f7264657273e807b0ea0100010107effdb6f50d010107",
        ),
        (
            Command::EndTxn {
                topic: "orders".into(),
                queue: 1,
                now_ms: 1_700_000_030_005,
                check_at_ms: 1_700_000_060_000,
                log_index: 88,
                position: 0,
                commit: true,
                messages: vec![StoredBody {
                    key: String::new(),
                    tag: "t".into(),
                    body: bytes::Bytes::from_static(b"x"),
                    properties: vec![],
                }],
            },
            "12066f726465727301b5ba97ffbc31e0a499ffbc3158000101000174017800",
        ),
        (
            Command::PutUser {
                access_key: "alice".into(),
                secret: "s3cret-key".into(),
                admin: false,
                create: true,
            },
            "1305616c6963650a7333637265742d6b65790001",
        ),
        (
            Command::DeleteUser {
                access_key: "alice".into(),
            },
            "1405616c696365",
        ),
        (
            Command::ChangeRule {
                access_key: "alice".into(),
                rule: rule(),
                revoke: false,
            },
            "1505616c696365010200010300076f72646572732d00",
        ),
        (
            send_many(),
            "1680d095ffbc3102066f72646572730307ac02010561756469740000000102026b310474616741\
             0568656c6c6f0201700176057472616365027831000004000102ff00",
        ),
    ]
}

/// A `SendMany` of two parts: the golden send's two messages, one in each of two topics.
fn send_many() -> Command {
    let Command::Send { messages, .. } = send() else {
        panic!("send() is a Send");
    };
    Command::SendMany {
        timestamp_ms: 1_700_000_000_000,
        parts: vec![
            SendPart {
                topic: "orders".into(),
                queue: 3,
                producer_id: 7,
                sequence: 300,
                count: 1,
            },
            SendPart {
                topic: "audit".into(),
                queue: 0,
                producer_id: 0,
                sequence: 0,
                count: 1,
            },
        ],
        messages,
    }
}

/// A rule of every part: an effect, two actions, a prefix pattern.
fn rule() -> raftmq_security::acl::Rule {
    raftmq_security::acl::Rule::parse(
        raftmq_security::acl::Effect::Deny,
        "Pub,Sub",
        "topic:orders-*",
    )
    .unwrap()
}

/// Every reply variant, in tag order, with its frozen encoding.
fn replies() -> Vec<(Reply, &'static str)> {
    vec![
        (Reply::Ok, "00"),
        (
            Reply::Sent {
                queue: 3,
                first_offset: 1000,
                count: 2,
                log_index: 77,
                duplicate: true,
            },
            "0103e807024d01",
        ),
        (Reply::TopicNotFound("orders".into()), "02066f7264657273"),
        (Reply::TopicExists { queues: 8 }, "0308"),
        (
            Reply::Invalid("no queue 9".into()),
            "040a6e6f2071756575652039",
        ),
        (
            Reply::Popped {
                issued: 42,
                delivered: vec![(1, 7, 2, 1_700_000_030_000)],
                dead: vec![(0, 5)],
            },
            "052a01010702b0ba97ffbc31010005",
        ),
        (Reply::Acked(vec![true, false]), "06020100"),
        (
            Reply::Changed {
                issued: 43,
                invisible_until_ms: 1_700_000_010_002,
            },
            "072b929e96ffbc31",
        ),
        (Reply::InvalidHandle("h".into()), "080168"),
        (Reply::GroupNotFound("g1".into()), "09026731"),
        (Reply::GroupExists("g1".into()), "0a026731"),
        (
            Reply::SentBefore(vec![Some((3, 1000)), None]),
            "0b020103e80700",
        ),
        (
            Reply::Scheduled {
                queue: 1,
                count: 2,
                log_index: 88,
                duplicate: false,
            },
            "0c01025800",
        ),
        (Reply::NotScheduled("gone".into()), "0d04676f6e65"),
        (
            Reply::SentMany(vec![
                (
                    Reply::Sent {
                        queue: 3,
                        first_offset: 10,
                        count: 1,
                        log_index: 77,
                        duplicate: false,
                    },
                    0,
                ),
                (Reply::TopicNotFound("audit".into()), 1),
            ]),
            "0e0201030a014d00000205617564697401",
        ),
    ]
}

/// Prints each case's encoding (to update a table while a variant is being added), then checks
/// that each encodes to its golden bytes and that the golden bytes decode back to it.
fn check_golden<T: std::fmt::Debug + PartialEq>(
    cases: Vec<(T, &str)>,
    encode: impl Fn(&T) -> Vec<u8>,
    decode: impl Fn(&[u8]) -> Result<T, postcard::Error>,
) {
    for (value, _) in &cases {
        println!("{value:?}\n  {}", hex(&encode(value)));
    }
    for (value, golden) in cases {
        let bytes = encode(&value);
        assert_eq!(hex(&bytes), golden, "{value:?}");
        assert_eq!(decode(&unhex(golden)).unwrap(), value);
    }
}

#[test]
fn every_command_encodes_to_its_golden_bytes_and_back() {
    check_golden(commands(), Command::encode, Command::decode);
}

#[test]
fn a_send_views_its_golden_bytes() {
    let golden = unhex(commands()[2].1);
    let CommandView::Send {
        topic, messages, ..
    } = CommandView::view(&golden).unwrap()
    else {
        panic!("not a send");
    };
    assert_eq!(topic, "orders");
    assert_eq!(messages.len(), 2);
    assert_eq!(
        (messages[0].key, messages[0].tag, messages[0].body),
        ("k1", "tagA", &b"hello"[..])
    );
    assert_eq!(messages[0].properties, vec![("p", "v"), ("trace", "x1")]);
    assert_eq!(messages[1].body, &[0u8, 1, 2, 255][..]);
}

#[test]
fn every_reply_encodes_to_its_golden_bytes_and_back() {
    check_golden(replies(), Reply::encode, Reply::decode);
}

/// A state with a topic, a consumer offset, a producer window, a trim point and applied counters.
fn state() -> BrokerState {
    let mut st = BrokerState::default();
    st.apply(
        1,
        1,
        &Command::CreateTopic {
            name: "orders".into(),
            queues: 2,
            update: false,
        }
        .encode(),
    );
    let cmd = Command::Send {
        topic: "orders".into(),
        queue: 1,
        producer_id: 42,
        sequence: 7,
        timestamp_ms: 5,
        messages: vec![
            StoredBody {
                key: String::new(),
                tag: String::new(),
                body: bytes::Bytes::from_static(b"m"),
                properties: vec![],
            };
            3
        ],
    };
    st.apply(2, 1, &cmd.encode());
    st.apply(
        3,
        1,
        &Command::CommitOffset {
            group: "g1".into(),
            topic: "orders".into(),
            queue: 1,
            offset: 2,
        }
        .encode(),
    );
    st.apply(4, 1, &Command::Trim { upto_log_index: 1 }.encode());
    st
}

const STATE_GOLDEN: &str =
    "01066f7264657273020000000301026731066f72646572730102012a0201070100030204010301";

/// Version 1, written bare by earlier builds: still restores (no typed topics, no POP state).
#[test]
fn a_version_1_broker_state_snapshot_still_restores() {
    let mut back = BrokerState::default();
    back.restore(&unhex(STATE_GOLDEN)).unwrap();
    // A restore counts as a topic change, so registration re-announces the topics.
    assert_eq!(back.topic_version, state().topic_version + 1);
    back.topic_version -= 1;
    assert_eq!(back.snapshot(), state().snapshot());
    assert_eq!(
        back.offsets.get(&("g1".into(), "orders".into(), 1)),
        Some(&2)
    );
    assert_eq!(back.queue("orders", 1).map(|q| q.next_offset), Some(3));
    assert!(back.pop.groups.is_empty() && back.topic_types.is_empty());
}

/// [`state`] plus a FIFO topic, a consumer group and a message in flight: version 2's fields.
fn state_v2() -> BrokerState {
    let mut st = state();
    for (i, cmd) in [
        Command::ConfigureTopic {
            name: "fifo".into(),
            queues: 1,
            update: false,
            message_type: 1,
        },
        Command::UpsertGroup {
            name: "g1".into(),
            max_attempts: 3,
            retry_delays_ms: vec![],
            fifo: false,
            update: false,
        },
        Command::Pop {
            group: "g1".into(),
            topic: "orders".into(),
            now_ms: 1000,
            invisible_ms: 500,
            create_group: false,
            picks: vec![(1, 0)],
            advance: vec![(1, 1)],
        },
    ]
    .iter()
    .enumerate()
    {
        st.apply(5 + i as u64, 1, &cmd.encode());
    }
    st
}

const STATE_V2_GOLDEN: &str = "ffffffffffffffffffff0200000002046669666f010000066f7264657273020000000301026731066f72646572730102012a020107010003020702030101046669666f01e8070102673103000001026731066f726465727301010100dc0b01070000";

/// Version 2, written by earlier builds: still restores (no client message ids remembered).
#[test]
fn a_version_2_broker_state_snapshot_still_restores() {
    let mut back = BrokerState::default();
    back.restore(&unhex(STATE_V2_GOLDEN)).unwrap();
    back.topic_version -= 1;
    assert_eq!(back.snapshot(), state_v2().snapshot());
    assert_eq!(back.topic_type("fifo"), 1);
    let pq = &back.pop.queues[&("g1".into(), "orders".into(), 1)];
    assert_eq!((pq.next, pq.inflight[&0].deadline_ms), (1, 1500));
    assert!(back.sent_ids.is_empty());
}

/// [`state_v2`] plus a message stored with a client message id: version 3's fields.
fn state_v3() -> BrokerState {
    let mut st = state_v2();
    // Producer 42 again: the producers' map is encoded in hash order, which varies between runs
    // when it holds more than one producer.
    let Command::SendOnce {
        topic,
        queue,
        sequence,
        timestamp_ms,
        id_property,
        messages,
        ..
    } = commands()[12].0.clone()
    else {
        panic!("tag 12 is SendOnce");
    };
    let send_once = Command::SendOnce {
        topic,
        queue,
        producer_id: 42,
        sequence,
        timestamp_ms,
        id_property,
        messages,
    };
    st.apply(9, 1, &send_once.encode());
    st.apply(
        10,
        1,
        &Command::CreateTopic {
            name: "orders".into(),
            queues: 4,
            update: true,
        }
        .encode(),
    );
    st.apply(11, 1, &send_once.encode());
    st
}

const STATE_V3_GOLDEN: &str = "ffffffffffffffffffff0300000002046669666f010000066f726465727304000000030000000101026731066f72646572730102012a0b0207010003020a0300010b0b03040101046669666f01e8070102673103000001026731066f726465727301010100dc0b0107000001af9af493fff1aff19793edaeb096deff90280300";

/// Version 3, written by earlier builds: still restores (no FIFO message group held).
#[test]
fn a_version_3_broker_state_snapshot_still_restores() {
    let mut back = BrokerState::default();
    back.restore(&unhex(STATE_V3_GOLDEN)).unwrap();
    back.topic_version -= 1;
    assert_eq!(back.snapshot(), state_v3().snapshot());
    assert_eq!(back.sent_ids.len(), 1);
    assert_eq!(
        back.sent_ids
            .get(crate::state::SentIds::key("orders", "M1")),
        Some((3, 0))
    );
    assert!(back.pop.fifo.is_empty());
}

/// [`state_v3`] plus a FIFO group holding a message group: version 4's fields.
fn state_v4() -> BrokerState {
    let mut st = state_v3();
    st.apply(
        12,
        1,
        &Command::UpsertGroup {
            name: "gf".into(),
            max_attempts: 0,
            retry_delays_ms: vec![],
            fifo: true,
            update: false,
        }
        .encode(),
    );
    let pop = Command::PopFifo {
        group: "gf".into(),
        topic: "orders".into(),
        now_ms: 2000,
        invisible_ms: 30_000,
        create_group: false,
        picks: vec![(3, 0, 0xdead_beef)],
        advance: vec![],
    };
    st.apply(13, 1, &pop.encode());
    st
}

/// [`state_v4`] plus a user with a rule: version 5's field.
fn state_v5() -> BrokerState {
    let mut st = state_v4();
    let put = Command::PutUser {
        access_key: "alice".into(),
        secret: "s3cret-key".into(),
        admin: false,
        create: true,
    };
    st.apply(14, 1, &put.encode());
    let grant = Command::ChangeRule {
        access_key: "alice".into(),
        rule: rule(),
        revoke: false,
    };
    st.apply(15, 1, &grant.encode());
    st
}

const STATE_V5_GOLDEN: &str = "ffffffffffffffffffff0500000002046669666f010000066f726465727304000000030000000101026731066f72646572730102012a0b0207010003020a0300010b0f03040101046669666f01d00f0202673103000002676600000102026731066f726465727301010100dc0b0107026766066f72646572730301010080fa01010d000001af9af493fff1aff19793edaeb096deff9028030001026766066f72646572730301effdb6f50d00000105616c69636505616c6963650a7333637265742d6b65790001010200010300076f72646572732d";

#[test]
fn a_broker_state_snapshot_v5_encodes_to_its_golden_bytes_and_back() {
    let snap = state_v5().snapshot();
    println!("state\n  {}", hex(&snap));
    assert_eq!(hex(&snap), STATE_V5_GOLDEN);
    let mut back = BrokerState::default();
    back.restore(&unhex(STATE_V5_GOLDEN)).unwrap();
    back.topic_version -= 1;
    assert_eq!(back.snapshot(), snap);
    let alice = &back.users["alice"];
    assert_eq!((alice.secret.as_str(), alice.admin), ("s3cret-key", false));
    assert_eq!(alice.rules, vec![rule()]);
}

const STATE_V4_GOLDEN: &str = "ffffffffffffffffffff0400000002046669666f010000066f726465727304000000030000000101026731066f72646572730102012a0b0207010003020a0300010b0d03040101046669666f01d00f0202673103000002676600000102026731066f726465727301010100dc0b0107026766066f72646572730301010080fa01010d000001af9af493fff1aff19793edaeb096deff9028030001026766066f72646572730301effdb6f50d0000";

#[test]
fn a_version_4_broker_state_snapshot_still_restores() {
    let mut back = BrokerState::default();
    back.restore(&unhex(STATE_V4_GOLDEN)).unwrap();
    back.topic_version -= 1;
    assert_eq!(back.snapshot(), state_v4().snapshot());
    assert_eq!(back.topic_type("fifo"), 1);
    let pq = &back.pop.queues[&("g1".into(), "orders".into(), 1)];
    assert_eq!((pq.next, pq.inflight[&0].deadline_ms), (1, 1500));
    assert_eq!(back.sent_ids.len(), 1);
    let key = ("gf".to_string(), "orders".to_string(), 3);
    assert_eq!(back.pop.fifo[&key].holding[&0xdead_beef], 0);
    assert_eq!(
        back.pop.queues[&key].next, 1,
        "the cursor passed the message handed out"
    );
    assert!(back.users.is_empty());
}

#[test]
fn the_golden_commands_cover_every_tag_in_order() {
    let tags: Vec<u8> = commands().iter().map(|(c, _)| c.encode()[0]).collect();
    assert_eq!(tags, (0..COMMAND_TAGS as u8).collect::<Vec<_>>());
    for (cmd, _) in commands() {
        assert_eq!(check_command_format(1, &cmd.encode()), Ok(()));
    }
}

/// A command of a tag this build does not know stops the member instead of being applied as
/// invalid (which would make this replica diverge), and says why.
#[test]
fn a_command_with_an_unknown_tag_stops_apply() {
    let mut st = state();
    let before = st.snapshot();
    let e = st.try_apply(9, 1, &[COMMAND_TAGS as u8, 1, 2]).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
    assert_eq!(
        e.to_string(),
        "log entry 9 holds a command with tag 23, which this broker-node does not know (command \
         format version 1 has tags 0..23): it was written by a newer version; upgrade the binary"
    );
    assert_eq!(st.snapshot(), before, "nothing applied");
    // A known command still applies.
    let ok = st
        .try_apply(9, 1, &Command::Trim { upto_log_index: 2 }.encode())
        .unwrap();
    assert_eq!(Reply::decode(&ok).unwrap(), Reply::Ok);
}

#[test]
fn a_command_in_a_newer_envelope_stops_apply() {
    let mut st = state();
    let cmd = format::envelope(2, &Command::Trim { upto_log_index: 2 }.encode());
    let e = st.try_apply(11, 1, &cmd).unwrap_err();
    assert_eq!(
        e.to_string(),
        "log entry 11 was written by format version 2; this broker-node reads up to version 1: \
         upgrade the binary"
    );
    assert_eq!(st.trimmed_index, 1);
}

#[test]
fn a_broker_state_snapshot_of_a_newer_format_is_refused() {
    let snap = format::envelope(6, &state().snapshot());
    let mut st = BrokerState::default();
    let e = st.restore(&snap).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
    assert_eq!(
        e.to_string(),
        "the broker-state snapshot was written by format version 6; this broker-node reads up to \
         version 5: upgrade the binary"
    );
    assert!(st.topics.is_empty());
}
