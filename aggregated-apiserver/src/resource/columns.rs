//! The Table columns a kind declares (kubectl's `get` output), and the cells every kind shares:
//! the name and apimachinery's Age.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Serialize;
use serde_json::Value;

/// A Table's `columnDefinitions` entry, as apimachinery's `metav1.TableColumnDefinition`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ColumnDefinition {
    /// The header kubectl prints, upper-cased (`Name` shows as NAME).
    pub name: &'static str,
    /// The cells' OpenAPI type: `string`, `integer`, `number`, `boolean`, or `date`.
    #[serde(rename = "type")]
    pub type_: &'static str,
    /// An OpenAPI format refining the type (`name` for the name column); "" for none.
    pub format: &'static str,
    /// What the column shows, for humans.
    pub description: &'static str,
    /// 0 shows always; 1 only with `kubectl get -o wide`.
    pub priority: i32,
}

impl ColumnDefinition {
    /// A column shown always, with no format.
    pub const fn new(name: &'static str, type_: &'static str, description: &'static str) -> Self {
        Self {
            name,
            type_,
            format: "",
            description,
            priority: 0,
        }
    }

    /// With the OpenAPI format `format`.
    pub const fn format(mut self, format: &'static str) -> Self {
        self.format = format;
        self
    }

    /// Shown only with `kubectl get -o wide`.
    pub const fn wide(mut self) -> Self {
        self.priority = 1;
        self
    }
}

/// The first column of every Table, its cell the object's name.
pub const NAME_COLUMN: ColumnDefinition = ColumnDefinition::new(
    "Name",
    "string",
    "Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Name is primarily intended for creation idempotence and configuration definition. Cannot be updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names",
)
.format("name");

/// The Age column a kind lists among its own, its cell from [`age`].
pub const AGE_COLUMN: ColumnDefinition = ColumnDefinition::new(
    "Age",
    "date",
    "CreationTimestamp is a timestamp representing the server time when this object was created. It is not guaranteed to be set in happens-before order across separate operations. Clients may not set this value. It is represented in RFC3339 form and is in UTC.",
);

/// The Age cell: apimachinery's `duration.HumanDuration` of the time since creation.
pub fn age(meta: &ObjectMeta, now: jiff::Timestamp) -> Value {
    match &meta.creation_timestamp {
        Some(created) => {
            let seconds = now.as_second() - created.0.as_second();
            Value::String(human_duration(seconds))
        }
        None => Value::String("<unknown>".into()),
    }
}

/// apimachinery `util/duration.HumanDuration`, to the letter.
pub fn human_duration(seconds: i64) -> String {
    if seconds < -1 {
        return "<invalid>".into();
    }
    if seconds < 0 {
        return "0s".into();
    }
    if seconds < 60 * 2 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        let s = seconds % 60;
        return if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        };
    }
    if minutes < 60 * 3 {
        return format!("{minutes}m");
    }
    let hours = seconds / 3600;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 {
            format!("{}d", hours / 24)
        } else {
            format!("{}d{h}h", hours / 24)
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        let dy = (hours / 24) % 365;
        return if dy == 0 {
            format!("{}y", hours / 24 / 365)
        } else {
            format!("{}y{dy}d", hours / 24 / 365)
        };
    }
    format!("{}y", hours / 24 / 365)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_like_kubectl() {
        let cases = [
            (-5, "<invalid>"),
            (-1, "0s"),
            (0, "0s"),
            (119, "119s"),
            (120, "2m"),
            (185, "3m5s"),
            (600, "10m"),
            (3 * 3600 + 5 * 60, "3h5m"),
            (8 * 3600, "8h"),
            (50 * 3600, "2d2h"),
            (10 * 86400, "10d"),
            (3 * 365 * 86400, "3y"),
            (3 * 365 * 86400 + 86400 * 4, "3y4d"),
            (9 * 365 * 86400, "9y"),
        ];
        for (seconds, want) in cases {
            assert_eq!(human_duration(seconds), want, "{seconds}s");
        }
    }
}
