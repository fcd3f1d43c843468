//! Serde helpers shared by the request and response types.

use std::fmt;
use std::marker::PhantomData;

use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};

/// Reads a JSON object as its entries, in order, keeping duplicate keys.
///
/// Deserializing straight into a map would let a later duplicate silently replace an
/// earlier one; keeping every entry lets the builders reject duplicates with a message.
pub(crate) fn ordered_entries<'de, D, T>(deserializer: D) -> Result<Vec<(String, T)>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct EntriesVisitor<T>(PhantomData<T>);

    impl<'de, T: Deserialize<'de>> Visitor<'de> for EntriesVisitor<T> {
        type Value = Vec<(String, T)>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("an object")
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            // Cap the hint: it comes from the input and must not drive a huge allocation.
            let mut entries = Vec::with_capacity(map.size_hint().unwrap_or(0).min(64));
            while let Some(entry) = map.next_entry::<String, T>()? {
                entries.push(entry);
            }
            Ok(entries)
        }
    }

    deserializer.deserialize_map(EntriesVisitor(PhantomData))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize)]
    struct Holder {
        #[serde(deserialize_with = "ordered_entries")]
        entries: Vec<(String, u32)>,
    }

    #[test]
    fn keeps_order_and_duplicates() {
        let holder: Holder = serde_json::from_str(r#"{"entries":{"b":1,"a":2,"b":3}}"#).unwrap();
        assert_eq!(
            holder.entries,
            vec![("b".into(), 1), ("a".into(), 2), ("b".into(), 3)]
        );
    }

    #[test]
    fn rejects_non_objects() {
        assert!(serde_json::from_str::<Holder>(r#"{"entries":[1,2]}"#).is_err());
    }
}
