//! The client's own checks: etcd's wire format, its errors and watch responses as the store's.

use prost::Message;

use super::*;

#[test]
fn progress_is_ordered_from_3_4_31_and_3_5_13() {
    for (version, ordered) in [
        ("3.4.30", false),
        ("3.4.31", true),
        ("3.5.1", false),
        ("3.5.12", false),
        ("3.5.13", true),
        ("3.6.0", true),
        ("3.3.27", false),
        ("4.0.0", true),
        ("garbage", false),
    ] {
        assert_eq!(orders_progress(version), ordered, "{version}");
    }
}

#[test]
fn messages_are_etcds_wire_format() {
    let request = pb::RangeRequest {
        key: b"/k".to_vec(),
        limit: 1,
        count_only: true,
        ..Default::default()
    };
    // Field 1 (bytes "/k"), field 3 (varint 1), field 9 (true): the bytes etcd's Go client
    // sends for the same request.
    assert_eq!(
        request.encode_to_vec(),
        [0x0a, 2, b'/', b'k', 0x18, 1, 0x48, 1]
    );
    // A reply with a header (cluster_id 7, revision 42) and a count.
    let reply = pb::RangeResponse::decode(&[0x0a, 4, 0x08, 7, 0x18, 42, 0x20, 1][..]).unwrap();
    assert_eq!(RangeResponse::from(reply).header.revision, 42);
    // "Absent" compares the create revision with 0: the 0 must be on the wire (a oneof
    // member), or etcd would see no target value at all.
    let absent = pb::Compare {
        target: compare::CompareTarget::Create as i32,
        key: b"/k".to_vec(),
        target_union: Some(compare::TargetUnion::CreateRevision(0)),
        ..Default::default()
    };
    assert_eq!(
        absent.encode_to_vec(),
        [0x10, 1, 0x1a, 2, b'/', b'k', 0x28, 0]
    );
}

#[test]
fn grpc_errors_map_to_the_stores_errors() {
    let from = |code, message: &str| grpc_error("e", &tonic::Status::new(code, message));
    use tonic::Code;
    assert!(matches!(
        from(Code::Unavailable, "etcdserver: no leader"),
        (EtcdError::Unavailable(_), true)
    ));
    assert!(matches!(
        from(Code::InvalidArgument, "etcdserver: key is not provided"),
        (EtcdError::Refused(_), _)
    ));
    assert!(matches!(
        from(
            Code::ResourceExhausted,
            "etcdserver: mvcc: database space exceeded"
        ),
        (EtcdError::Refused(_), _)
    ));
    assert!(matches!(
        from(Code::OutOfRange, ""),
        (EtcdError::Compacted(_), _)
    ));
}

/// A member that refuses the connection: a write never left, so it is not reported as one that
/// may have been applied (and a read fails over).
#[tokio::test]
async fn a_refused_connection_is_a_write_that_never_left() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .unwrap()
        .port();
    let client = EtcdClient::new(EtcdConfig {
        endpoints: vec![format!("http://127.0.0.1:{port}")],
        tls: None,
        request_timeout: Duration::from_secs(5),
    })
    .unwrap();
    match client.txn(b"/k", Compare::Absent, Some(b"v")).await {
        Err(EtcdError::Unavailable(reason)) => {
            assert!(!reason.contains("may or may not"), "{reason}");
            // The cause, not only hyper's "client error (Connect)".
            assert!(reason.to_lowercase().contains("refused"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        client.revision(b"/k").await,
        Err(EtcdError::Unavailable(_))
    ));
}

#[test]
fn watch_responses_are_events() {
    let kv = |key: &[u8], revision| mvccpb::KeyValue {
        key: key.to_vec(),
        mod_revision: revision,
        value: b"{}".to_vec(),
        ..Default::default()
    };
    let created = pb::WatchResponse {
        created: true,
        ..Default::default()
    };
    assert!(watch_events(created).unwrap().is_empty());
    let progress = pb::WatchResponse {
        header: Some(pb::ResponseHeader {
            revision: 9,
            ..Default::default()
        }),
        ..Default::default()
    };
    assert!(matches!(
        watch_events(progress).unwrap()[..],
        [WatchEvent::Progress(9)]
    ));
    let events = pb::WatchResponse {
        events: vec![
            mvccpb::Event {
                r#type: mvccpb::event::EventType::Put as i32,
                kv: Some(kv(b"/a", 5)),
                prev_kv: None,
            },
            mvccpb::Event {
                r#type: mvccpb::event::EventType::Delete as i32,
                kv: Some(mvccpb::KeyValue {
                    key: b"/a".to_vec(),
                    mod_revision: 6,
                    ..Default::default()
                }),
                prev_kv: Some(kv(b"/a", 5)),
            },
        ],
        ..Default::default()
    };
    match &watch_events(events).unwrap()[..] {
        [
            WatchEvent::Put(put),
            WatchEvent::Delete {
                revision: 6,
                previous,
            },
        ] => {
            assert_eq!((&put.key[..], put.mod_revision), (&b"/a"[..], 5));
            assert_eq!(previous.value, b"{}");
        }
        other => panic!("{other:?}"),
    }
    let compacted = pb::WatchResponse {
        canceled: true,
        compact_revision: 3,
        ..Default::default()
    };
    assert!(matches!(
        watch_events(compacted),
        Err(EtcdError::Compacted(3))
    ));
}

#[test]
fn prefix_ends() {
    assert_eq!(prefix_end(b"/a/"), b"/a0");
    assert_eq!(prefix_end(b"a\xff"), b"b");
    assert_eq!(prefix_end(b"\xff"), [0]);
}
