//! `labelSelector` and `fieldSelector` query parameters, parsed with apimachinery's grammar.
//!
//! Matching uses kube's `Selector`; kube has no string parser, and the crates that parse one
//! reject common selectors (digits inside `in (...)`, prefixed keys after `!`), so the grammar of
//! `k8s.io/apimachinery/pkg/labels.Parse` is written out here.

use std::collections::{BTreeMap, BTreeSet};

use kube::core::{Expression, Selector, SelectorExt};

use crate::{
    error::{Error, Result},
    resource::{ObjectKey, ServedResource},
};

/// A parsed `labelSelector`. Empty matches everything.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector {
    selector: Selector,
    /// For each `=`/`in` requirement, the hashes of the `key=value` pairs that satisfy it: an
    /// object whose [`label_hashes`] miss every one of a set cannot match (a cheap first test
    /// when scanning thousands of objects).
    required: Vec<Vec<u64>>,
}

/// Hash of one `key=value` label pair, stable for the life of the process.
pub fn label_pair_hash(key: &str, value: &str) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    static STATE: std::sync::OnceLock<std::collections::hash_map::RandomState> =
        std::sync::OnceLock::new();
    let mut hasher = STATE.get_or_init(Default::default).build_hasher();
    hasher.write(key.as_bytes());
    hasher.write_u8(0xff);
    hasher.write(value.as_bytes());
    hasher.finish()
}

/// The sorted pair hashes of a label set, kept with each stored object.
pub fn label_hashes(labels: Option<&BTreeMap<String, String>>) -> Vec<u64> {
    let mut hashes: Vec<u64> = labels
        .into_iter()
        .flatten()
        .map(|(k, v)| label_pair_hash(k, v))
        .collect();
    hashes.sort_unstable();
    hashes
}

impl LabelSelector {
    /// Parses a `labelSelector` value (`a=b,c!=d,e in (f,g),!h`); 400 BadRequest when it does
    /// not parse.
    pub fn parse(input: &str) -> Result<Self> {
        let exprs = Parser::new(input).parse().map_err(|message| {
            Error::BadRequest(format!("unable to parse requirement: {message}"))
        })?;
        let required = exprs
            .iter()
            .filter_map(|e| match e {
                Expression::Equal(k, v) => Some(vec![label_pair_hash(k, v)]),
                Expression::In(k, values) => {
                    Some(values.iter().map(|v| label_pair_hash(k, v)).collect())
                }
                _ => None,
            })
            .collect();
        Ok(Self {
            selector: exprs.into_iter().collect(),
            required,
        })
    }

    /// The pair hash of an `=`/`==` requirement, whose objects a label index can list.
    pub fn indexed_hash(&self) -> Option<u64> {
        self.required
            .iter()
            .find(|set| set.len() == 1)
            .map(|set| set[0])
    }

    /// False when the object's label pair hashes show it cannot match; true means "check".
    pub fn may_match(&self, hashes: &[u64]) -> bool {
        self.required
            .iter()
            .all(|set| set.iter().any(|h| hashes.binary_search(h).is_ok()))
    }

    /// Whether an object with `labels` (None: no labels) is selected.
    pub fn matches(&self, labels: Option<&BTreeMap<String, String>>) -> bool {
        if self.selector.selects_all() {
            return true;
        }
        match labels {
            Some(labels) => self.selector.matches(labels),
            None => self.selector.matches(&BTreeMap::new()),
        }
    }

    /// Selects everything (no requirement).
    pub fn is_empty(&self) -> bool {
        self.selector.selects_all()
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Ident(String),
    Comma,
    Open,
    Close,
    Equals,
    NotEquals,
    Not,
    In,
    NotIn,
    Greater,
    Less,
}

fn tokenize(input: &str) -> Result<Vec<Token>, String> {
    let mut tokens = Vec::new();
    let mut chars = input.chars().peekable();
    while let Some(&c) = chars.peek() {
        match c {
            c if c.is_whitespace() => {
                chars.next();
            }
            ',' => {
                chars.next();
                tokens.push(Token::Comma);
            }
            '(' => {
                chars.next();
                tokens.push(Token::Open);
            }
            ')' => {
                chars.next();
                tokens.push(Token::Close);
            }
            '>' => {
                chars.next();
                tokens.push(Token::Greater);
            }
            '<' => {
                chars.next();
                tokens.push(Token::Less);
            }
            '=' => {
                chars.next();
                if chars.peek() == Some(&'=') {
                    chars.next();
                }
                tokens.push(Token::Equals);
            }
            '!' => {
                chars.next();
                if chars.peek() == Some(&'=') {
                    chars.next();
                    tokens.push(Token::NotEquals);
                } else {
                    tokens.push(Token::Not);
                }
            }
            _ => {
                let mut word = String::new();
                while let Some(&c) = chars.peek() {
                    if c.is_whitespace() || ",()=!<>".contains(c) {
                        break;
                    }
                    word.push(c);
                    chars.next();
                }
                tokens.push(match word.as_str() {
                    "in" => Token::In,
                    "notin" => Token::NotIn,
                    _ => Token::Ident(word),
                });
            }
        }
    }
    Ok(tokens)
}

struct Parser {
    tokens: Vec<Token>,
    pos: usize,
    input: String,
}

impl Parser {
    fn new(input: &str) -> Self {
        Self {
            tokens: Vec::new(),
            pos: 0,
            input: input.to_owned(),
        }
    }

    fn next(&mut self) -> Option<Token> {
        let token = self.tokens.get(self.pos).cloned();
        self.pos += 1;
        token
    }

    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.pos)
    }

    fn parse(mut self) -> Result<Vec<Expression>, String> {
        self.tokens = tokenize(&self.input)?;
        let mut exprs = Vec::new();
        if self.tokens.is_empty() {
            return Ok(exprs);
        }
        loop {
            exprs.push(self.requirement()?);
            match self.next() {
                None => return Ok(exprs),
                Some(Token::Comma) => {}
                Some(other) => return Err(format!("found '{other:?}', expected: ',' or end")),
            }
        }
    }

    fn requirement(&mut self) -> Result<Expression, String> {
        match self.next() {
            Some(Token::Not) => {
                let key = self.key()?;
                Ok(Expression::DoesNotExist(key))
            }
            Some(Token::Ident(key)) => {
                validate_key(&key)?;
                match self.peek() {
                    None | Some(Token::Comma) => Ok(Expression::Exists(key)),
                    Some(Token::Equals) => {
                        self.next();
                        Ok(Expression::Equal(key, self.value()?))
                    }
                    Some(Token::NotEquals) => {
                        self.next();
                        Ok(Expression::NotEqual(key, self.value()?))
                    }
                    Some(Token::In) => {
                        self.next();
                        Ok(Expression::In(key, self.values()?))
                    }
                    Some(Token::NotIn) => {
                        self.next();
                        Ok(Expression::NotIn(key, self.values()?))
                    }
                    Some(Token::Greater | Token::Less) => Err(format!(
                        "operator '>' and '<' are not supported for key {key:?}"
                    )),
                    Some(other) => Err(format!(
                        "found '{other:?}', expected: '=', '!=', '==', 'in', 'notin'"
                    )),
                }
            }
            Some(other) => Err(format!("found '{other:?}', expected: !, identifier")),
            None => Err("found '', expected: !, identifier".to_owned()),
        }
    }

    fn key(&mut self) -> Result<String, String> {
        match self.next() {
            Some(Token::Ident(key)) => {
                validate_key(&key)?;
                Ok(key)
            }
            other => Err(format!("found '{other:?}', expected: identifier after '!'")),
        }
    }

    fn value(&mut self) -> Result<String, String> {
        match self.peek() {
            // `key=` selects the empty value, as apimachinery allows.
            None | Some(Token::Comma) => Ok(String::new()),
            Some(Token::Ident(_)) => match self.next() {
                Some(Token::Ident(value)) => {
                    validate_value(&value)?;
                    Ok(value)
                }
                _ => Err("expected a value".to_owned()),
            },
            Some(other) => Err(format!("found '{other:?}', expected: identifier")),
        }
    }

    fn values(&mut self) -> Result<BTreeSet<String>, String> {
        if self.next() != Some(Token::Open) {
            return Err("expected: '(' after 'in' or 'notin'".to_owned());
        }
        let mut values = BTreeSet::new();
        loop {
            match self.next() {
                Some(Token::Ident(value)) => {
                    validate_value(&value)?;
                    values.insert(value);
                    match self.next() {
                        Some(Token::Comma) => {}
                        Some(Token::Close) => break,
                        other => return Err(format!("found '{other:?}', expected: ',' or ')'")),
                    }
                }
                Some(Token::Close) if values.is_empty() => {
                    return Err("for 'in', 'notin' operators, values set can't be empty".to_owned());
                }
                other => return Err(format!("found '{other:?}', expected: identifier")),
            }
        }
        Ok(values)
    }
}

fn validate_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix
        && !crate::resource::validation::is_dns1123_subdomain(prefix)
    {
        return Err(format!(
            "invalid label key {key:?}: prefix part must be a lowercase RFC 1123 subdomain"
        ));
    }
    if !crate::resource::validation::is_label_name(name) {
        return Err(format!(
            "invalid label key {key:?}: name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"
        ));
    }
    Ok(())
}

fn validate_value(value: &str) -> Result<(), String> {
    if value.is_empty() || crate::resource::validation::is_label_name(value) {
        Ok(())
    } else {
        Err(format!(
            "invalid label value: {value:?}: a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"
        ))
    }
}

/// A parsed `fieldSelector`: every kind supports `metadata.name` and `metadata.namespace`, and
/// each kind may add its own ([`ServedResource::SELECTABLE_FIELDS`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FieldSelector {
    requirements: Vec<FieldRequirement>,
}

#[derive(Debug, Clone, PartialEq)]
struct FieldRequirement {
    field: Field,
    value: String,
    equals: bool,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Field {
    Name,
    Namespace,
    /// One of the kind's own selectable fields.
    Other(&'static str),
}

impl FieldSelector {
    /// A selector of the metadata fields only.
    pub fn parse(input: &str) -> Result<Self> {
        Self::parse_for(input, &[])
    }

    /// `metadata.name=<name>`, built rather than parsed (a name is not escaped).
    pub fn name(name: &str) -> Self {
        Self {
            requirements: vec![FieldRequirement {
                field: Field::Name,
                value: name.to_owned(),
                equals: true,
            }],
        }
    }

    /// A selector of the metadata fields and `fields`, a kind's selectable fields.
    pub fn parse_for(input: &str, fields: &'static [&'static str]) -> Result<Self> {
        let mut requirements = Vec::new();
        for term in split_unescaped(input, ',') {
            let term = term.trim();
            if term.is_empty() {
                continue;
            }
            let (field, value, equals) = if let Some((f, v)) = term.split_once("!=") {
                (f, v, false)
            } else if let Some((f, v)) = term.split_once("==") {
                (f, v, true)
            } else if let Some((f, v)) = term.split_once('=') {
                (f, v, true)
            } else {
                return Err(Error::BadRequest(format!(
                    "invalid selector: '{input}'; can't understand '{term}'"
                )));
            };
            let field = match field.trim() {
                "metadata.name" => Field::Name,
                "metadata.namespace" => Field::Namespace,
                other => match fields.iter().find(|f| **f == other) {
                    Some(field) => Field::Other(field),
                    None => {
                        return Err(Error::BadRequest(format!(
                            "field label not supported: {other}"
                        )));
                    }
                },
            };
            requirements.push(FieldRequirement {
                field,
                value: unescape(value.trim()),
                equals,
            });
        }
        Ok(Self { requirements })
    }

    /// Whether the object at `key` matches; `field` gives the value of a kind's own field.
    pub fn matches(&self, key: &ObjectKey, field: impl Fn(&str) -> Option<String>) -> bool {
        self.requirements.iter().all(|r| {
            let equal = match r.field {
                Field::Name => key.name == r.value,
                Field::Namespace => key.namespace == r.value,
                Field::Other(name) => field(name).unwrap_or_default() == r.value,
            };
            equal == r.equals
        })
    }

    /// Selects everything (no requirement).
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// The single name an `metadata.name=x` selector pins, so a list can be a lookup.
    pub fn exact_name(&self) -> Option<&str> {
        self.requirements
            .iter()
            .find(|r| r.field == Field::Name && r.equals)
            .map(|r| r.value.as_str())
    }
}

fn split_unescaped(input: &str, sep: char) -> Vec<String> {
    let mut parts = Vec::new();
    let mut current = String::new();
    let mut escaped = false;
    for c in input.chars() {
        if escaped {
            current.push('\\');
            current.push(c);
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == sep {
            parts.push(std::mem::take(&mut current));
        } else {
            current.push(c);
        }
    }
    parts.push(current);
    parts
}

fn unescape(value: &str) -> String {
    let mut out = String::new();
    let mut escaped = false;
    for c in value.chars() {
        if escaped || c != '\\' {
            out.push(c);
            escaped = false;
        } else {
            escaped = true;
        }
    }
    out
}

/// Both selectors of a list or watch request, applied together.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// `labelSelector`.
    pub labels: LabelSelector,
    /// `fieldSelector`.
    pub fields: FieldSelector,
}

impl Filter {
    /// Whether `object`, stored at `key`, passes both selectors.
    pub fn matches<K: ServedResource>(&self, key: &ObjectKey, object: &K) -> bool {
        self.fields.matches(key, |name| object.field(name))
            && self.labels.matches(object.meta().labels.as_ref())
    }

    /// Neither selector has a requirement: every object passes.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.fields.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn parses_the_full_label_grammar() {
        let sel =
            LabelSelector::parse("app in (a, b2),tier notin (db),!legacy,env=prod,zone!=z1,team")
                .unwrap();
        let l = labels(&[
            ("app", "b2"),
            ("env", "prod"),
            ("team", "x"),
            ("tier", "web"),
        ]);
        assert!(sel.matches(Some(&l)));
        let l = labels(&[
            ("app", "b2"),
            ("env", "prod"),
            ("team", "x"),
            ("legacy", ""),
        ]);
        assert!(!sel.matches(Some(&l)));
        assert!(
            LabelSelector::parse("app.kubernetes.io/name==farm")
                .unwrap()
                .matches(Some(&labels(&[("app.kubernetes.io/name", "farm")])))
        );
        assert!(
            LabelSelector::parse("!app.kubernetes.io/name")
                .unwrap()
                .matches(None)
        );
        assert!(LabelSelector::parse("").unwrap().is_empty());
    }

    #[test]
    fn rejects_malformed_label_selectors() {
        for bad in [
            "app in ()",
            "app in (a",
            "=x",
            "app==x==y",
            "-bad=x",
            "a b",
            "app=in",
            "app>5",
        ] {
            let err = LabelSelector::parse(bad).expect_err(bad);
            assert_eq!(err.code(), 400, "{bad}");
        }
    }

    #[test]
    fn field_selector_supports_name_and_namespace_only() {
        let sel =
            FieldSelector::parse("metadata.name=dolly,metadata.namespace!=kube-system").unwrap();
        assert!(sel.matches(&ObjectKey::new("default", "dolly"), |_| None));
        assert!(!sel.matches(&ObjectKey::new("kube-system", "dolly"), |_| None));
        assert_eq!(sel.exact_name(), Some("dolly"));
        let err = FieldSelector::parse("spec.weight=1").unwrap_err();
        assert_eq!(err.code(), 400);
        assert!(err.to_string().contains("field label not supported"));
        assert!(FieldSelector::parse("nonsense").is_err());
    }
}
