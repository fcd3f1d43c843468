//! JSON whose objects each name a key once.
//!
//! RFC 8259 leaves an object with a repeated key to the reader, and readers differ: serde_json
//! keeps the last value, others the first. A configuration file or a request body that says two
//! things at once is refused here instead, with the key and where it is
//! (`mcpServers.memory: duplicate key "command" at line 4 column 17`), so that no reader has to
//! guess which one was meant.

use std::cell::RefCell;
use std::fmt;

use serde::de::{DeserializeOwned, DeserializeSeed, Error as _, MapAccess, SeqAccess, Visitor};

/// Parses `bytes` as a `T`, refusing any object that names a key twice.
pub fn from_slice<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, serde_json::Error> {
    check(bytes)?;
    serde_json::from_slice(bytes)
}

/// Parses `text` as a `T`, refusing any object that names a key twice.
pub fn from_str<T: DeserializeOwned>(text: &str) -> Result<T, serde_json::Error> {
    from_slice(text.as_bytes())
}

/// Checks that `bytes` is one JSON value whose objects each name a key once. The error names
/// the object by its JSON path (`a.b[2]`; nothing for the top level), the key and its line and
/// column, or is serde_json's own syntax error.
pub fn check(bytes: &[u8]) -> Result<(), serde_json::Error> {
    let found = RefCell::new(None);
    scan(bytes, &found)
}

/// A key that one object names twice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DuplicateKey {
    /// The JSON path of the key (`tools[0].name`; the key alone at the top level).
    pub path: String,
    /// The key, unescaped.
    pub key: String,
    /// The line of its second naming, from 1.
    pub line: usize,
    /// The column where its second naming ends, from 1.
    pub column: usize,
}

/// `duplicate key "name" at line 3 column 9`: the path is left to the caller, which may name it
/// as a field of its own.
impl fmt::Display for DuplicateKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "duplicate key {:?} at line {} column {}",
            self.key, self.line, self.column
        )
    }
}

/// The first key that an object in `bytes` names twice. `None` when every object names its keys
/// once, and also when `bytes` is not JSON: a reader that goes on to parse them reports that in
/// its own words, which a server's existing answers keep.
pub fn duplicate_key(bytes: &[u8]) -> Option<DuplicateKey> {
    let found = RefCell::new(None);
    let error = scan(bytes, &found).err()?;
    let (path, key) = found.into_inner()?;
    Some(DuplicateKey {
        path,
        key,
        line: error.line(),
        column: error.column(),
    })
}

/// Reads `bytes` as one value, leaving the path and key of a repeated key in `found`.
fn scan(bytes: &[u8], found: &Found) -> Result<(), serde_json::Error> {
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    Unique(&Path::Root, found).deserialize(&mut deserializer)?;
    deserializer.end()
}

/// Where a repeated key was met, and which: serde's errors carry only text.
type Found = RefCell<Option<(String, String)>>;

/// Where a value is, rendered only when an error names it: building every path of a large body
/// would cost more than the check.
enum Path<'a> {
    Root,
    Key(&'a Path<'a>, &'a str),
    Index(&'a Path<'a>, usize),
}

impl fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Path::Root => Ok(()),
            Path::Key(Path::Root, key) => f.write_str(key),
            Path::Key(parent, key) => write!(f, "{parent}.{key}"),
            Path::Index(parent, i) => write!(f, "{parent}[{i}]"),
        }
    }
}

/// Visits one value and everything in it, keeping nothing but the keys of the object at hand.
struct Unique<'a>(&'a Path<'a>, &'a Found);

impl<'de> DeserializeSeed<'de> for Unique<'_> {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Unique<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }

    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }

    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }

    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut items: A) -> Result<(), A::Error> {
        let mut i = 0;
        while items
            .next_element_seed(Unique(&Path::Index(self.0, i), self.1))?
            .is_some()
        {
            i += 1;
        }
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut entries: A) -> Result<(), A::Error> {
        // Most objects are small: a scan of the keys so far beats hashing them.
        let mut keys: Vec<String> = Vec::new();
        while let Some(key) = entries.next_key::<String>()? {
            if keys.contains(&key) {
                let at = match self.0 {
                    Path::Root => String::new(),
                    path => format!("{path}: "),
                };
                *self.1.borrow_mut() = Some((Path::Key(self.0, &key).to_string(), key.clone()));
                return Err(A::Error::custom(format_args!("{at}duplicate key {key:?}")));
            }
            entries.next_value_seed(Unique(&Path::Key(self.0, &key), self.1))?;
            keys.push(key);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::*;

    #[test]
    fn a_repeated_key_is_refused_naming_it_and_its_object() {
        let error = |text: &str| from_str::<Value>(text).unwrap_err().to_string();
        assert_eq!(
            error(r#"{"a": 1, "a": 2}"#),
            "duplicate key \"a\" at line 1 column 12"
        );
        assert_eq!(
            error("{\"mcpServers\": {\"m\": {\"command\": \"x\",\n \"command\": \"y\"}}}"),
            "mcpServers.m: duplicate key \"command\" at line 2 column 10"
        );
        assert_eq!(
            error(r#"[{}, {"x": [1, {"k": 1, "k": 1}]}]"#),
            "[1].x[1]: duplicate key \"k\" at line 1 column 27"
        );
        // The same key in different objects, escapes and all, is fine.
        let value: Value =
            from_str(r#"{"a": {"a": 1}, "b": [{"a": 1}, {"a": 2}], "\u0061b": 1.5}"#).unwrap();
        assert_eq!(value["ab"], json!(1.5));
        assert!(error(r#"{"a": 1} x"#).starts_with("trailing characters"));
        assert!(error(r#"{"a": }"#).starts_with("expected value"));
    }

    #[test]
    fn a_repeated_key_is_found_with_its_path_and_not_json_is_left_to_the_reader() {
        let found = duplicate_key(b"{\"tools\": [{\"name\": \"a\",\n \"name\": \"b\"}]}").unwrap();
        assert_eq!(
            found,
            DuplicateKey {
                path: "tools[0].name".into(),
                key: "name".into(),
                line: 2,
                column: 7,
            }
        );
        assert_eq!(
            found.to_string(),
            "duplicate key \"name\" at line 2 column 7"
        );
        assert_eq!(duplicate_key(br#"{"a": 1, "a": 2}"#).unwrap().path, "a");
        assert_eq!(duplicate_key(br#"{"a": {"a": 1}, "b": [{"a": 1}]}"#), None);
        // Not JSON: the parser that follows says what is wrong, in its own words.
        assert_eq!(duplicate_key(br#"{"a": 1, "b": }"#), None);
        assert_eq!(duplicate_key(b""), None);
    }

    #[test]
    fn escaped_spellings_of_one_key_are_one_key() {
        assert!(check(br#"{"id": 1, "\u0069d": 2}"#).is_err());
    }
}
