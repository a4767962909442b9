//! The `audit.k8s.io/v1` Event and what it says of a request (user, source IPs, objectRef,
//! responseStatus, micro-second times), written by [`super::json`].

use super::*;

/// Go's encoder escapes `<`, `>` and `&` in strings; they appear nowhere else in JSON.
pub(super) fn escape_html(line: &mut Vec<u8>) {
    if memchr::memchr3(b'<', b'>', b'&', line).is_none() {
        return;
    }
    let mut out = Vec::with_capacity(line.len() + 16);
    for &b in line.iter() {
        match b {
            b'<' => out.extend_from_slice(b"\\u003c"),
            b'>' => out.extend_from_slice(b"\\u003e"),
            b'&' => out.extend_from_slice(b"\\u0026"),
            _ => out.push(b),
        }
    }
    *line = out;
}

/// `metav1.MicroTime` as JSON writes it: UTC, microseconds (`2006-01-02T15:04:05.000000Z`).
/// Written digit by digit: `strftime` cost more than the rest of an event's metadata.
pub(super) fn micro_time(at: jiff::Timestamp) -> String {
    thread_local! {
        /// The last second written and its text up to the fraction: a busy server writes
        /// many events a second.
        static LAST: std::cell::Cell<(i64, [u8; 20])> = const { std::cell::Cell::new((i64::MIN, [0; 20])) };
    }
    let micros = at.as_microsecond();
    let (seconds, micro) = (micros.div_euclid(1_000_000), micros.rem_euclid(1_000_000));
    let mut out = [0u8; 27];
    let (last, prefix) = LAST.get();
    if last == seconds {
        out[..20].copy_from_slice(&prefix);
    } else {
        second_text(seconds, &mut out);
        let mut prefix = [0u8; 20];
        prefix.copy_from_slice(&out[..20]);
        LAST.set((seconds, prefix));
    }
    digits(micro, &mut out[20..26]);
    out[26] = b'Z';
    String::from_utf8_lossy(&out).into_owned()
}

/// `2006-01-02T15:04:05.` of a second since 1970, into `out[..20]`.
fn second_text(seconds: i64, out: &mut [u8; 27]) {
    let (days, of_day) = (seconds.div_euclid(86_400), seconds.rem_euclid(86_400));
    // The civil date of a day count since 1970-01-01 (Howard Hinnant's `civil_from_days`),
    // cheaper than a time zone's conversion.
    let z = days + 719_468;
    let (era, of_era) = (z.div_euclid(146_097), z.rem_euclid(146_097));
    let year_of_era = (of_era - of_era / 1460 + of_era / 36_524 - of_era / 146_096) / 365;
    let day_of_year = of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * shifted_month + 2) / 5 + 1;
    let month = if shifted_month < 10 {
        shifted_month + 3
    } else {
        shifted_month - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    let parts = [
        (year, 0, 4, b'-'),
        (month, 5, 2, b'-'),
        (day, 8, 2, b'T'),
        (of_day / 3600, 11, 2, b':'),
        (of_day / 60 % 60, 14, 2, b':'),
        (of_day % 60, 17, 2, b'.'),
    ];
    for (value, at, width, after) in parts {
        digits(value, &mut out[at..at + width]);
        out[at + width] = after;
    }
}

/// `value`'s last decimal digits, filling `out`.
fn digits(value: i64, out: &mut [u8]) {
    let mut rest = value.unsigned_abs();
    for slot in out.iter_mut().rev() {
        *slot = b'0' + (rest % 10) as u8;
        rest /= 10;
    }
}

/// The client's addresses as k8s.io/apiserver's `SourceIPs` reads them: the first
/// `X-Forwarded-For` header's, then `X-Real-Ip` when not already named, then the peer's own
/// address (`remote`) unless it is the last already: it cannot be spoofed.
pub(super) fn source_ips(headers: &HeaderMap, remote: Option<std::net::IpAddr>) -> Vec<String> {
    let mut ips: Vec<String> = headers
        .get("x-forwarded-for")
        .and_then(|v| v.to_str().ok())
        .into_iter()
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|ip| ip.parse::<std::net::IpAddr>().is_ok())
        .map(str::to_owned)
        .collect();
    if let Some(real) = headers
        .get("x-real-ip")
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|ip| ip.parse::<std::net::IpAddr>().is_ok())
        && !ips.iter().any(|ip| ip == real)
    {
        ips.push(real.to_owned());
    }
    if let Some(remote) = remote {
        let last = ips
            .last()
            .and_then(|ip| ip.parse::<std::net::IpAddr>().ok());
        if last != Some(remote) {
            ips.push(ip_text(remote));
        }
    }
    ips
}

/// An address as text: an IPv4 one digit by digit (`Display` costs more than the rest of
/// its event's header).
pub(super) fn ip_text(ip: std::net::IpAddr) -> String {
    let std::net::IpAddr::V4(v4) = ip else {
        return ip.to_string();
    };
    let mut text = String::with_capacity(15);
    for (index, octet) in v4.octets().into_iter().enumerate() {
        if index > 0 {
            text.push('.');
        }
        if octet >= 100 {
            text.push(char::from(b'0' + octet / 100));
        }
        if octet >= 10 {
            text.push(char::from(b'0' + octet / 10 % 10));
        }
        text.push(char::from(b'0' + octet % 10));
    }
    text
}

/// User agents past 1024 bytes are cut, as kube-apiserver cuts them; invalid UTF-8 is
/// replaced.
pub(super) fn truncate_agent(agent: &[u8]) -> Cow<'_, str> {
    const MAX: usize = 1024;
    let agent =
        std::str::from_utf8(agent).map_or_else(|_| String::from_utf8_lossy(agent), Cow::Borrowed);
    if agent.len() <= MAX {
        return agent;
    }
    let mut end = MAX;
    while !agent.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Owned(format!("{}...TRUNCATED", &agent[..end]))
}

/// The answer's `Audit-Id` header.
pub fn id_header(id: &str) -> Option<HeaderValue> {
    HeaderValue::from_str(id).ok()
}

/// `audit.k8s.io/v1` Event, its fields in kube-apiserver's order. It borrows what it can of
/// the request while it is written at once ([`Auditor::complete_sync`]); a [`Record`] keeps
/// it owned ([`Event::into_owned`]).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Event<'a> {
    pub(super) kind: &'static str,
    pub(super) api_version: &'static str,
    pub(super) level: Level,
    #[serde(rename = "auditID")]
    pub(super) audit_id: Cow<'a, str>,
    pub(super) stage: Stage,
    #[serde(rename = "requestURI")]
    pub(super) request_uri: Cow<'a, str>,
    pub(super) verb: &'static str,
    pub(super) user: EventUser<'a>,
    /// The user the request acted as, when it impersonated.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) impersonated_user: Option<EventUser<'a>>,
    #[serde(rename = "sourceIPs", skip_serializing_if = "Vec::is_empty")]
    pub(super) source_ips: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) user_agent: Option<Cow<'a, str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) object_ref: Option<ObjectRef<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) response_status: Option<ResponseStatus>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) request_object: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) response_object: Option<Value>,
    pub(super) request_received_timestamp: String,
    pub(super) stage_timestamp: String,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub(super) annotations: BTreeMap<Cow<'static, str>, String>,
}

impl<'a> Event<'a> {
    /// A request's event as it is received.
    pub(super) fn of(
        level: Level,
        id: &'a str,
        user: Option<&'a UserInfo>,
        info: &RequestInfo<'a>,
        (uri, headers, remote): RequestParts<'a>,
    ) -> Self {
        let now = micro_time(jiff::Timestamp::now());
        Self {
            kind: "Event",
            api_version: "audit.k8s.io/v1",
            level,
            audit_id: Cow::Borrowed(id),
            stage: Stage::RequestReceived,
            request_uri: Cow::Borrowed(
                uri.path_and_query()
                    .map_or_else(|| uri.path(), |p| p.as_str()),
            ),
            verb: info.verb,
            user: user.map(EventUser::of).unwrap_or_default(),
            impersonated_user: None,
            source_ips: source_ips(headers, remote),
            user_agent: headers
                .get(axum::http::header::USER_AGENT)
                .map(|v| truncate_agent(v.as_bytes())),
            object_ref: info.is_resource_request.then_some(ObjectRef {
                resource: Cow::Borrowed(info.resource),
                namespace: Cow::Borrowed(info.namespace),
                name: Cow::Borrowed(info.name),
                uid: Cow::Borrowed(""),
                api_group: Cow::Borrowed(info.api_group),
                api_version: Cow::Borrowed(info.api_version),
                resource_version: Cow::Borrowed(""),
                subresource: Cow::Borrowed(info.subresource),
            }),
            response_status: None,
            request_object: None,
            response_object: None,
            request_received_timestamp: now.clone(),
            stage_timestamp: now,
            annotations: BTreeMap::new(),
        }
    }

    /// The event, borrowing nothing.
    pub(super) fn into_owned(self) -> Event<'static> {
        Event {
            kind: self.kind,
            api_version: self.api_version,
            level: self.level,
            audit_id: owned(self.audit_id),
            stage: self.stage,
            request_uri: owned(self.request_uri),
            verb: self.verb,
            user: self.user.into_owned(),
            impersonated_user: self.impersonated_user.map(EventUser::into_owned),
            source_ips: self.source_ips,
            user_agent: self.user_agent.map(owned),
            object_ref: self.object_ref.map(|r| ObjectRef {
                resource: owned(r.resource),
                namespace: owned(r.namespace),
                name: owned(r.name),
                uid: owned(r.uid),
                api_group: owned(r.api_group),
                api_version: owned(r.api_version),
                resource_version: owned(r.resource_version),
                subresource: owned(r.subresource),
            }),
            response_status: self.response_status,
            request_object: self.request_object,
            response_object: self.response_object,
            request_received_timestamp: self.request_received_timestamp,
            stage_timestamp: self.stage_timestamp,
            annotations: self.annotations,
        }
    }
}

fn owned(text: Cow<'_, str>) -> Cow<'static, str> {
    Cow::Owned(text.into_owned())
}

/// An event's `responseStatus`: the part of a `meta/v1` Status kube-apiserver keeps, in its
/// order (its empty `metadata` included).
#[derive(Debug, Clone, Serialize)]
pub(super) struct ResponseStatus {
    pub(super) metadata: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) status: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) message: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) reason: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) details: Option<Value>,
    pub(super) code: u16,
}

impl ResponseStatus {
    pub(super) fn code(code: u16) -> Self {
        Self {
            metadata: BTreeMap::new(),
            status: None,
            message: None,
            reason: None,
            details: None,
            code,
        }
    }

    /// The Panic stage's status, in kube-apiserver's words.
    pub(super) fn panicked() -> Self {
        Self {
            status: Some("Failure".into()),
            message: Some("APIServer panic'd".into()),
            reason: Some("InternalError".into()),
            ..Self::code(500)
        }
    }
}

#[derive(Debug, Clone, Default, Serialize)]
pub(super) struct EventUser<'a> {
    #[serde(skip_serializing_if = "str::is_empty")]
    pub(super) username: Cow<'a, str>,
    #[serde(skip_serializing_if = "str::is_empty")]
    pub(super) uid: Cow<'a, str>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    pub(super) groups: Cow<'a, [String]>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub(super) extra: Cow<'a, BTreeMap<String, Vec<String>>>,
}

impl<'a> EventUser<'a> {
    pub(super) fn of(user: &'a UserInfo) -> Self {
        Self {
            username: Cow::Borrowed(&user.name),
            uid: Cow::Borrowed(&user.uid),
            groups: Cow::Borrowed(&user.groups),
            extra: Cow::Borrowed(&user.extra),
        }
    }

    /// The user, borrowing nothing.
    fn into_owned(self) -> EventUser<'static> {
        EventUser {
            username: owned(self.username),
            uid: owned(self.uid),
            groups: Cow::Owned(self.groups.into_owned()),
            extra: Cow::Owned(self.extra.into_owned()),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ObjectRef<'a> {
    #[serde(skip_serializing_if = "str::is_empty")]
    pub(super) resource: Cow<'a, str>,
    #[serde(skip_serializing_if = "str::is_empty")]
    pub(super) namespace: Cow<'a, str>,
    #[serde(skip_serializing_if = "str::is_empty")]
    pub(super) name: Cow<'a, str>,
    #[serde(skip_serializing_if = "str::is_empty")]
    pub(super) uid: Cow<'a, str>,
    #[serde(skip_serializing_if = "str::is_empty")]
    pub(super) api_group: Cow<'a, str>,
    #[serde(skip_serializing_if = "str::is_empty")]
    pub(super) api_version: Cow<'a, str>,
    #[serde(skip_serializing_if = "str::is_empty")]
    pub(super) resource_version: Cow<'a, str>,
    #[serde(skip_serializing_if = "str::is_empty")]
    pub(super) subresource: Cow<'a, str>,
}
