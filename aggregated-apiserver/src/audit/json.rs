//! An event's JSON line written by hand: the bytes serde_json would write for [`Event`] (the
//! tests hold it to that), without its per-byte escaping loop, which cost more than the rest
//! of an audited GET's event. Strings are scanned eight bytes at a time for what JSON must
//! escape and copied whole when there is none; objects (`requestObject`, a Status's
//! `details`...) still go through serde_json. Go's HTML escaping is applied to the whole line
//! afterwards, as before.

use std::collections::BTreeMap;

use serde_json::Value;

use super::{Event, EventUser, Level, ObjectRef, ResponseStatus, Stage};

impl Event<'_> {
    /// The event's line at `stage` (its time now, unless it is the request's receipt).
    pub(super) fn line(&mut self, stage: Stage) -> Vec<u8> {
        self.stage = stage;
        if stage != Stage::RequestReceived {
            self.stage_timestamp = super::micro_time(jiff::Timestamp::now());
        }
        let mut line = Vec::with_capacity(1024);
        self.write_json(&mut line);
        super::escape_html(&mut line);
        line.push(b'\n');
        line
    }

    /// Appends the event's JSON (as `serde_json::to_writer` writes it) to `out`.
    pub(super) fn write_json(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(br#"{"kind":""#);
        out.extend_from_slice(self.kind.as_bytes());
        out.extend_from_slice(br#"","apiVersion":""#);
        out.extend_from_slice(self.api_version.as_bytes());
        out.extend_from_slice(br#"","level":""#);
        out.extend_from_slice(level(self.level).as_bytes());
        out.extend_from_slice(br#"","auditID":"#);
        string(out, &self.audit_id);
        out.extend_from_slice(br#","stage":""#);
        out.extend_from_slice(stage(self.stage).as_bytes());
        out.extend_from_slice(br#"","requestURI":"#);
        string(out, &self.request_uri);
        out.extend_from_slice(br#","verb":""#);
        out.extend_from_slice(self.verb.as_bytes());
        out.push(b'"');
        out.extend_from_slice(br#","user":"#);
        user(out, &self.user);
        if let Some(impersonated) = &self.impersonated_user {
            out.extend_from_slice(br#","impersonatedUser":"#);
            user(out, impersonated);
        }
        if !self.source_ips.is_empty() {
            out.extend_from_slice(br#","sourceIPs":"#);
            strings(out, &self.source_ips);
        }
        if let Some(agent) = &self.user_agent {
            out.extend_from_slice(br#","userAgent":"#);
            string(out, agent);
        }
        if let Some(object_ref) = &self.object_ref {
            out.extend_from_slice(br#","objectRef":"#);
            object_reference(out, object_ref);
        }
        if let Some(status) = &self.response_status {
            out.extend_from_slice(br#","responseStatus":"#);
            response_status(out, status);
        }
        if let Some(object) = &self.request_object {
            out.extend_from_slice(br#","requestObject":"#);
            value(out, object);
        }
        if let Some(object) = &self.response_object {
            out.extend_from_slice(br#","responseObject":"#);
            value(out, object);
        }
        out.extend_from_slice(br#","requestReceivedTimestamp":"#);
        string(out, &self.request_received_timestamp);
        out.extend_from_slice(br#","stageTimestamp":"#);
        string(out, &self.stage_timestamp);
        if !self.annotations.is_empty() {
            out.extend_from_slice(br#","annotations":"#);
            string_map(out, &self.annotations);
        }
        out.push(b'}');
    }
}

fn level(level: Level) -> &'static str {
    match level {
        Level::None => "None",
        Level::Metadata => "Metadata",
        Level::Request => "Request",
        Level::RequestResponse => "RequestResponse",
    }
}

fn stage(stage: Stage) -> &'static str {
    match stage {
        Stage::RequestReceived => "RequestReceived",
        Stage::ResponseStarted => "ResponseStarted",
        Stage::ResponseComplete => "ResponseComplete",
        Stage::Panic => "Panic",
    }
}

/// `{"username":..,"uid":..,"groups":[..],"extra":{..}}`, empty parts left out.
fn user(out: &mut Vec<u8>, user: &EventUser) {
    let mut fields = Fields::open(out);
    if !user.username.is_empty() {
        string(fields.key("username"), &user.username);
    }
    if !user.uid.is_empty() {
        string(fields.key("uid"), &user.uid);
    }
    if !user.groups.is_empty() {
        strings(fields.key("groups"), &user.groups);
    }
    if !user.extra.is_empty() {
        let out = fields.key("extra");
        out.push(b'{');
        for (index, (key, values)) in user.extra.iter().enumerate() {
            if index > 0 {
                out.push(b',');
            }
            string(out, key);
            out.push(b':');
            strings(out, values);
        }
        out.push(b'}');
    }
    fields.close();
}

fn object_reference(out: &mut Vec<u8>, reference: &ObjectRef) {
    let mut fields = Fields::open(out);
    for (key, text) in [
        ("resource", &reference.resource),
        ("namespace", &reference.namespace),
        ("name", &reference.name),
        ("uid", &reference.uid),
        ("apiGroup", &reference.api_group),
        ("apiVersion", &reference.api_version),
        ("resourceVersion", &reference.resource_version),
        ("subresource", &reference.subresource),
    ] {
        if !text.is_empty() {
            string(fields.key(key), text);
        }
    }
    fields.close();
}

fn response_status(out: &mut Vec<u8>, status: &ResponseStatus) {
    let mut fields = Fields::open(out);
    string_map(fields.key("metadata"), &status.metadata);
    for (key, part) in [
        ("status", &status.status),
        ("message", &status.message),
        ("reason", &status.reason),
        ("details", &status.details),
    ] {
        if let Some(part) = part {
            value(fields.key(key), part);
        }
    }
    let out = fields.key("code");
    let (mut digits, mut rest, mut at) = ([0u8; 5], status.code, 5);
    loop {
        at -= 1;
        digits[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
    fields.close();
}

/// An object's fields, each after a comma but the first.
struct Fields<'o> {
    out: &'o mut Vec<u8>,
    first: bool,
}

impl<'o> Fields<'o> {
    fn open(out: &'o mut Vec<u8>) -> Self {
        out.push(b'{');
        Self { out, first: true }
    }

    /// Writes `"key":` (a field name: nothing to escape) and gives the line for the value.
    fn key(&mut self, key: &'static str) -> &mut Vec<u8> {
        if !self.first {
            self.out.push(b',');
        }
        self.first = false;
        self.out.push(b'"');
        self.out.extend_from_slice(key.as_bytes());
        self.out.extend_from_slice(b"\":");
        self.out
    }

    fn close(self) {
        self.out.push(b'}');
    }
}

fn string_map<K: AsRef<str>>(out: &mut Vec<u8>, map: &BTreeMap<K, String>) {
    out.push(b'{');
    for (index, (key, text)) in map.iter().enumerate() {
        if index > 0 {
            out.push(b',');
        }
        string(out, key.as_ref());
        out.push(b':');
        string(out, text);
    }
    out.push(b'}');
}

fn strings(out: &mut Vec<u8>, texts: &[String]) {
    out.push(b'[');
    for (index, text) in texts.iter().enumerate() {
        if index > 0 {
            out.push(b',');
        }
        string(out, text);
    }
    out.push(b']');
}

fn value(out: &mut Vec<u8>, value: &Value) {
    // Writing to a Vec cannot fail; a Value's keys are strings.
    let _ = serde_json::to_writer(&mut *out, value);
}

/// Whether JSON must escape `byte` (serde_json's set: controls, `"` and `\`).
fn needs_escape(byte: u8) -> bool {
    byte < 0x20 || byte == b'"' || byte == b'\\'
}

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// Whether any of the eight bytes in `word` needs escaping: a byte below 0x20, `"` or `\`
/// (the classic word-at-a-time tests for a zero byte and a byte less than n, exact for n up
/// to 128).
fn word_needs_escape(word: u64) -> bool {
    let zero = |v: u64| v.wrapping_sub(ONES) & !v & HIGHS;
    let below_space = word.wrapping_sub(ONES * 0x20) & !word & HIGHS;
    below_space | zero(word ^ (ONES * u64::from(b'"'))) | zero(word ^ (ONES * u64::from(b'\\')))
        != 0
}

/// The first byte from `from` on that needs escaping, eight bytes at a time.
fn next_escape(bytes: &[u8], from: usize) -> Option<usize> {
    let rest = bytes.get(from..)?;
    let mut words = rest.chunks_exact(8);
    let mut at = from;
    for word in words.by_ref() {
        let value = u64::from_le_bytes(word.try_into().unwrap_or([0; 8]));
        if word_needs_escape(value) {
            return word.iter().position(|&b| needs_escape(b)).map(|i| at + i);
        }
        at += 8;
    }
    words
        .remainder()
        .iter()
        .position(|&b| needs_escape(b))
        .map(|i| at + i)
}

/// `text` as a JSON string, escaped as serde_json escapes.
fn string(out: &mut Vec<u8>, text: &str) {
    let bytes = text.as_bytes();
    out.reserve(bytes.len() + 2);
    out.push(b'"');
    let mut start = 0;
    while let Some(index) = next_escape(bytes, start) {
        let (Some(clean), Some(&byte)) = (bytes.get(start..index), bytes.get(index)) else {
            break;
        };
        out.extend_from_slice(clean);
        match byte {
            b'"' => out.extend_from_slice(br#"\""#),
            b'\\' => out.extend_from_slice(br"\\"),
            b'\x08' => out.extend_from_slice(br"\b"),
            b'\t' => out.extend_from_slice(br"\t"),
            b'\n' => out.extend_from_slice(br"\n"),
            b'\x0c' => out.extend_from_slice(br"\f"),
            b'\r' => out.extend_from_slice(br"\r"),
            control => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                out.extend_from_slice(br"\u00");
                out.push(HEX[usize::from(control >> 4)]);
                out.push(HEX[usize::from(control & 0xf)]);
            }
        }
        start = index + 1;
    }
    out.extend_from_slice(bytes.get(start..).unwrap_or_default());
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;
    use std::borrow::Cow;

    fn event() -> Event<'static> {
        Event {
            kind: "Event",
            api_version: "audit.k8s.io/v1",
            level: Level::RequestResponse,
            audit_id: "d0f0c8e2-8f7a-4cbe-9d36-5f2f1d7c8a10".into(),
            stage: Stage::ResponseComplete,
            request_uri: "/apis/zoo.example.com/v1alpha/namespaces/default/zebras/dolly?pretty=1"
                .into(),
            verb: "get",
            user: EventUser {
                username: "alice".into(),
                uid: "u-1".into(),
                groups: vec!["farmers".into(), "system:authenticated".into()].into(),
                extra: Cow::Owned(BTreeMap::from([
                    ("scopes".into(), vec!["a".into(), "b\"c".into()]),
                    ("x".into(), vec![]),
                ])),
            },
            impersonated_user: Some(EventUser {
                username: "system:serviceaccount:farm:robot".into(),
                groups: vec!["system:serviceaccounts".into()].into(),
                ..Default::default()
            }),
            source_ips: vec!["10.0.0.1".into(), "::1".into()],
            user_agent: Some("kubectl/v1.36.0 (linux/amd64) <tab>\t".into()),
            object_ref: Some(ObjectRef {
                resource: "zebras".into(),
                namespace: "default".into(),
                name: "dolly".into(),
                uid: "".into(),
                api_group: "zoo.example.com".into(),
                api_version: "v1alpha".into(),
                resource_version: "42".into(),
                subresource: "".into(),
            }),
            response_status: Some(ResponseStatus {
                status: Some(json!("Failure")),
                message: Some(json!("zebras \"x\" not found")),
                reason: Some(json!("NotFound")),
                details: Some(json!({"name": "x", "kind": "zebras"})),
                ..ResponseStatus::code(404)
            }),
            request_object: Some(json!({"spec": {"weight": 1.5, "tags": ["<a>", "\u{1}"]}})),
            response_object: None,
            request_received_timestamp: "2026-11-26T14:05:09.123456Z".into(),
            stage_timestamp: "2026-11-26T14:05:09.123999Z".into(),
            annotations: BTreeMap::from([
                ("authorization.k8s.io/decision".into(), "allow".into()),
                ("authorization.k8s.io/reason".into(), String::new()),
            ]),
        }
    }

    fn written(event: &Event) -> Vec<u8> {
        let mut out = Vec::new();
        event.write_json(&mut out);
        out
    }

    #[test]
    fn the_bytes_serde_json_writes() {
        let full = event();
        assert_eq!(written(&full), serde_json::to_vec(&full).unwrap());
        // And with every optional part left out.
        let bare = Event {
            user: EventUser::default(),
            source_ips: vec![],
            user_agent: None,
            object_ref: None,
            response_status: Some(ResponseStatus::code(200)),
            request_object: None,
            annotations: BTreeMap::new(),
            level: Level::Metadata,
            stage: Stage::RequestReceived,
            ..full
        };
        assert_eq!(written(&bare), serde_json::to_vec(&bare).unwrap());
    }

    proptest! {
        #[test]
        fn a_word_needs_escaping_when_one_of_its_bytes_does(word in any::<[u8; 8]>()) {
            prop_assert_eq!(
                word_needs_escape(u64::from_le_bytes(word)),
                word.iter().any(|&b| needs_escape(b))
            );
        }

        #[test]
        fn any_string_is_escaped_as_serde_json_escapes_it(text in any::<String>(), user_agent in "[\\x00-\\x7f]{0,80}") {
            let mut event = event();
            event.request_uri = text.clone().into();
            event.user.username = text.into();
            event.user_agent = Some(user_agent.into());
            prop_assert_eq!(written(&event), serde_json::to_vec(&event).unwrap());
        }
    }
}
