//! Reading a [`Block`] with its `kind` tag first, without buffering.
//!
//! serde's derived reader for an internally tagged enum cannot know the variant until it has
//! seen the tag, so it buffers every field of the object into an intermediate tree first and
//! converts afterwards: each string is copied twice, each JSON value built twice. That was most
//! of the cost of reading a context snapshot (one block per row, hundreds of rows per turn).
//!
//! Blocks as Turnpike writes them carry `kind` first (serde writes the tag before the fields).
//! So the reader takes the first key; when it is `kind`, the rest of the object goes straight
//! to the variant's own fields, through a twin of [`Block`] tagged by name (`ByKind`, made by
//! [`block_kinds!`](crate::block_kinds) from the same definition, so the two cannot drift apart). An object whose
//! tag comes later — written by hand or by another tool — is still read, the slow way: into a
//! JSON value first.
//!
//! An object reads as it did with the derived reader (the tests hold it to a twin read by
//! serde's own derive): the same variants, fields and defaults, unknown fields ignored, a
//! missing, unknown or repeated `kind` and a repeated field refused. Two forms the derive also
//! took are now refused: a block written as a sequence (`["user_message", "hi"]`) and a
//! variant named by its number (`"kind": 0`); Turnpike never wrote either.

use std::borrow::Cow;
use std::fmt;

use serde::de::value::{BorrowedStrDeserializer, StrDeserializer, StringDeserializer};
use serde::de::{
    self, DeserializeSeed, Deserializer, EnumAccess, IntoDeserializer, MapAccess, VariantAccess,
    Visitor,
};
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::turnlog::{Block, ByKind};

/// The tag's field name.
const TAG: &str = "kind";

impl<'de> Deserialize<'de> for Block {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(TagFirst)
    }
}

struct TagFirst;

impl<'de> Visitor<'de> for TagFirst {
    type Value = Block;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a block: an object with a `kind`")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Block, A::Error> {
        match map.next_key::<Key>()? {
            None => Err(de::Error::missing_field(TAG)),
            Some(Key::Tag) => {
                let kind: Text<'de> = map.next_value()?;
                let map = NoSecondTag(map);
                ByKind::deserialize(Rest { kind: kind.0, map }).map(Block::from)
            }
            Some(Key::Other(first)) => {
                // The tag comes later: gather the object, then read it by its tag.
                let mut object = Map::new();
                object.insert(first, map.next_value()?);
                while let Some((key, value)) = map.next_entry::<String, Value>()? {
                    if object.contains_key(&key) {
                        return Err(duplicate(&key));
                    }
                    object.insert(key, value);
                }
                let kind = match object.remove(TAG) {
                    Some(Value::String(kind)) => kind,
                    Some(other) => {
                        return Err(de::Error::invalid_type(unexpected(&other), &"a kind name"))
                    }
                    None => return Err(de::Error::missing_field(TAG)),
                };
                let by_name = Value::Object(Map::from_iter([(kind, Value::Object(object))]));
                ByKind::deserialize(by_name)
                    .map(Block::from)
                    .map_err(de::Error::custom)
            }
        }
    }
}

/// A key given twice: refused, as serde's derive refuses it (never first or last wins).
fn duplicate<E: de::Error>(key: &str) -> E {
    E::custom(format_args!("duplicate field `{key}`"))
}

/// The entries after the tag, refusing a second tag (serde's derive refuses it too; otherwise
/// the variant's fields would ignore it as an unknown field).
struct NoSecondTag<A>(A);

impl<'de, A: MapAccess<'de>> MapAccess<'de> for NoSecondTag<A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        let Some(Text(key)) = self.0.next_key::<Text<'de>>()? else {
            return Ok(None);
        };
        if key == TAG {
            return Err(duplicate(TAG));
        }
        match key {
            Cow::Borrowed(key) => seed.deserialize(BorrowedStrDeserializer::new(key)),
            Cow::Owned(key) => seed.deserialize(StringDeserializer::new(key)),
        }
        .map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, A::Error> {
        self.0.next_value_seed(seed)
    }

    fn size_hint(&self) -> Option<usize> {
        self.0.size_hint()
    }
}

fn unexpected(value: &Value) -> de::Unexpected<'_> {
    match value {
        Value::Null => de::Unexpected::Unit,
        Value::Bool(b) => de::Unexpected::Bool(*b),
        Value::Number(_) => de::Unexpected::Other("a number"),
        Value::String(s) => de::Unexpected::Str(s),
        Value::Array(_) => de::Unexpected::Seq,
        Value::Object(_) => de::Unexpected::Map,
    }
}

/// An object's first key: the tag, or another field (kept, for the slow way).
enum Key {
    Tag,
    Other(String),
}

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl Visitor<'_> for KeyVisitor {
            type Value = Key;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a field name")
            }
            fn visit_str<E: de::Error>(self, key: &str) -> Result<Key, E> {
                Ok(if key == TAG {
                    Key::Tag
                } else {
                    Key::Other(key.to_owned())
                })
            }
        }
        deserializer.deserialize_identifier(KeyVisitor)
    }
}

/// A string, borrowed from the input when the input allows it.
struct Text<'de>(Cow<'de, str>);

impl<'de> Deserialize<'de> for Text<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct TextVisitor;
        impl<'de> Visitor<'de> for TextVisitor {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a kind name")
            }
            fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Borrowed(s)))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(s.to_owned())))
            }
        }
        deserializer.deserialize_str(TextVisitor)
    }
}

/// The rest of an object whose tag was read: an enum access whose variant is the tag and whose
/// fields are the object's remaining entries.
struct Rest<'de, A> {
    kind: Cow<'de, str>,
    map: A,
}

impl<'de, A: MapAccess<'de>> Deserializer<'de> for Rest<'de, A> {
    type Error = A::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, A::Error> {
        visitor.visit_enum(self)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map struct enum
        identifier ignored_any
    }
}

impl<'de, A: MapAccess<'de>> EnumAccess<'de> for Rest<'de, A> {
    type Error = A::Error;
    type Variant = Self;

    fn variant_seed<S: DeserializeSeed<'de>>(self, seed: S) -> Result<(S::Value, Self), A::Error> {
        let name: StrDeserializer<'_, A::Error> = self.kind.as_ref().into_deserializer();
        let variant = seed.deserialize(name)?;
        Ok((variant, self))
    }
}

impl<'de, A: MapAccess<'de>> VariantAccess<'de> for Rest<'de, A> {
    type Error = A::Error;

    fn unit_variant(self) -> Result<(), A::Error> {
        Err(de::Error::invalid_type(
            de::Unexpected::Map,
            &"a block with fields",
        ))
    }

    fn newtype_variant_seed<S: DeserializeSeed<'de>>(self, _: S) -> Result<S::Value, A::Error> {
        Err(de::Error::invalid_type(
            de::Unexpected::Map,
            &"a block with fields",
        ))
    }

    fn tuple_variant<V: Visitor<'de>>(self, _: usize, _: V) -> Result<V::Value, A::Error> {
        Err(de::Error::invalid_type(
            de::Unexpected::Map,
            &"a block with fields",
        ))
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, A::Error> {
        visitor.visit_map(self.map)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::ids::{RequestId, TurnId};

    /// One block of every kind, with every optional field set.
    fn every_kind() -> Vec<Block> {
        let reference: crate::Reference = format!(
            "conv:fi:{}/turn_2/out/a%20b.txt",
            crate::ConversationId::new()
        )
        .parse()
        .unwrap();
        let request = RequestId::new();
        vec![
            Block::UserMessage {
                text: "hé \"quoted\"\n".into(),
            },
            Block::FollowUp {
                text: "more".into(),
            },
            Block::Steer {
                text: "left".into(),
            },
            Block::Stop {
                reason: Some("enough".into()),
            },
            Block::Stop { reason: None },
            Block::AssistantMessage {
                text: "answer".into(),
            },
            Block::ToolCall {
                call_id: "c1".into(),
                tool: "read_file".into(),
                arguments: json!({"path": "a.txt", "kind": "not the tag", "n": [1, 2.5, null]}),
            },
            Block::ToolResult {
                call_id: "c1".into(),
                ok: false,
                output: json!("text"),
            },
            Block::File {
                path: "out/a b.txt".into(),
                reference: reference.clone(),
                size: 3,
                media_type: "text/plain".into(),
            },
            Block::Artifact {
                name: "a.png".into(),
                media_type: "image/png".into(),
                data_base64: "AAAA".into(),
            },
            Block::Summary {
                through: TurnId::new(4).unwrap(),
                text: "so far".into(),
            },
            Block::Attachment {
                name: "b.pdf".into(),
                media_type: "application/pdf".into(),
                reference,
            },
            Block::ApprovalRequest {
                request_id: request,
                call_id: "c2".into(),
                tool: "send".into(),
                arguments: json!({}),
                approvers: vec!["local:alice".parse().unwrap()],
                withheld: "thinking".into(),
                connection: None,
            },
            Block::ApprovalRequest {
                request_id: request,
                call_id: "c4".into(),
                tool: "tickets__create".into(),
                arguments: json!({"title": "x"}),
                approvers: vec!["local:bob".parse().unwrap()],
                withheld: String::new(),
                connection: Some("tickets".into()),
            },
            Block::ApprovalResponse {
                request_id: request,
                approved: false,
                by: Some("local:alice".parse().unwrap()),
                reason: Some("no".into()),
                automatic: true,
                refused: Some("not an approver".into()),
            },
            Block::QuestionRequest {
                request_id: request,
                call_id: "c3".into(),
                question: "which?".into(),
            },
            Block::QuestionResponse {
                request_id: request,
                answer: "that".into(),
                automatic: false,
            },
            Block::AgentSwitched {
                from: "a".parse().unwrap(),
                to: "b".parse().unwrap(),
            },
            Block::Recall {
                query: "q".into(),
                hits: vec![crate::RecallHit {
                    reference: "conv:tl:x".into(),
                    conversation: crate::ConversationId::new(),
                    turn: TurnId::new(1).unwrap(),
                    kind: "prompt".into(),
                    score: 0.5,
                    snippet: String::new(),
                }],
                note: Some("partial".into()),
            },
        ]
    }

    /// The object's entries in another order: `kind` last.
    fn tag_last(block: &Block) -> String {
        let Value::Object(mut object) = serde_json::to_value(block).unwrap() else {
            panic!("blocks are objects")
        };
        let kind = object.remove(TAG).unwrap();
        let mut text = serde_json::to_string(&Value::Object(object)).unwrap();
        text.pop();
        if !text.ends_with('{') {
            text.push(',');
        }
        format!("{text}\"kind\":{kind}}}")
    }

    #[test]
    fn every_kind_reads_back_tag_first_tag_last_and_from_a_value() {
        for block in every_kind() {
            let written = serde_json::to_string(&block).unwrap();
            assert!(written.starts_with("{\"kind\":"), "{written}");
            assert_eq!(serde_json::from_str::<Block>(&written).unwrap(), block);
            let last = tag_last(&block);
            assert_eq!(
                serde_json::from_str::<Block>(&last).unwrap(),
                block,
                "{last}"
            );
            let value = serde_json::to_value(&block).unwrap();
            assert_eq!(serde_json::from_value::<Block>(value).unwrap(), block);
        }
    }

    #[test]
    fn defaults_apply_and_unknown_fields_are_ignored_either_way() {
        for text in [
            r#"{"kind":"recall","query":"q","extra":{"deep":[1]}}"#,
            r#"{"extra":{"deep":[1]},"query":"q","kind":"recall"}"#,
        ] {
            let block: Block = serde_json::from_str(text).unwrap();
            assert_eq!(
                block,
                Block::Recall {
                    query: "q".into(),
                    hits: vec![],
                    note: None
                },
                "{text}"
            );
        }
    }

    #[test]
    fn a_missing_unknown_or_misshapen_tag_is_refused_with_its_reason() {
        for (text, why) in [
            (r#"{}"#, "missing field `kind`"),
            (r#"{"text":"a"}"#, "missing field `kind`"),
            (
                r#"{"kind":"telepathy","text":"a"}"#,
                "unknown variant `telepathy`",
            ),
            (
                r#"{"text":"a","kind":"telepathy"}"#,
                "unknown variant `telepathy`",
            ),
            (r#"{"kind":7,"text":"a"}"#, "invalid type"),
            (r#"{"text":"a","kind":7}"#, "invalid type"),
            (r#"{"kind":"user_message"}"#, "missing field `text`"),
            (r#"{"kind":"user_message","text":5}"#, "invalid type"),
            (r#"["user_message","a"]"#, "invalid type"),
            (r#""user_message""#, "invalid type"),
        ] {
            let error = serde_json::from_str::<Block>(text).unwrap_err().to_string();
            assert!(error.contains(why), "{text}: {error}");
        }
    }

    #[test]
    fn an_escaped_tag_and_kind_are_read_like_plain_ones() {
        let block: Block =
            serde_json::from_str(r#"{"\u006bind":"user\u005fmessage","text":"a"}"#).unwrap();
        assert_eq!(block, Block::UserMessage { text: "a".into() });
    }

    /// What serde's own derive makes of `text`, in the same terms.
    fn derived(text: &str) -> Result<Block, String> {
        serde_json::from_str::<crate::turnlog::Derived>(text)
            .map(Block::from)
            .map_err(|e| e.to_string())
    }

    /// Objects near each block: its fields in both orders, each field left out, given another
    /// type, and an extra field.
    fn variations(block: &Block) -> Vec<String> {
        let Value::Object(object) = serde_json::to_value(block).unwrap() else {
            panic!("blocks are objects")
        };
        let mut out = vec![serde_json::to_string(block).unwrap(), tag_last(block)];
        let with = |change: &dyn Fn(&mut Map<String, Value>)| {
            let mut changed = object.clone();
            change(&mut changed);
            // Tag first, as written, then the rest (a Value's map sorts its keys).
            let kind = changed.remove(TAG);
            let mut text = String::from("{");
            if let Some(kind) = kind {
                text.push_str(&format!("\"kind\":{kind},"));
            }
            for (key, value) in &changed {
                text.push_str(&format!("{}:{value},", Value::String(key.clone())));
            }
            if text.ends_with(',') {
                text.pop();
            }
            text.push('}');
            text
        };
        for key in object.keys() {
            out.push(with(&|o| {
                o.remove(key);
            }));
            for other in [
                json!(null),
                json!(7),
                json!("x"),
                json!({"a": [1]}),
                json!(true),
            ] {
                out.push(with(&|o| {
                    o.insert(key.clone(), other.clone());
                }));
            }
        }
        out.push(with(&|o| {
            o.insert("unheard_of".into(), json!({"kind": "user_message"}));
        }));
        out
    }

    #[test]
    fn every_variation_of_every_kind_reads_as_serdes_derive_reads_it() {
        let mut compared = 0;
        for block in every_kind() {
            for text in variations(&block) {
                let ours = serde_json::from_str::<Block>(&text).map_err(|e| e.to_string());
                match (&ours, derived(&text)) {
                    (Ok(a), Ok(b)) => assert_eq!(*a, b, "{text}"),
                    (Err(_), Err(_)) => {}
                    (a, b) => panic!("{text}: tag first {a:?}, derived {b:?}"),
                }
                compared += 1;
            }
        }
        assert!(compared > 300, "{compared}");
    }

    #[test]
    fn a_repeated_tag_or_field_is_refused_wherever_the_tag_is() {
        for text in [
            r#"{"kind":"user_message","text":"a","kind":"tool_call"}"#,
            r#"{"kind":"user_message","kind":"user_message","text":"a"}"#,
            r#"{"kind":"user_message","text":"a","text":"b"}"#,
            r#"{"text":"a","text":"b","kind":"user_message"}"#,
            r#"{"text":"a","kind":"user_message","kind":"tool_call"}"#,
        ] {
            let error = serde_json::from_str::<Block>(text).unwrap_err().to_string();
            assert!(error.contains("duplicate field"), "{text}: {error}");
            assert!(derived(text).is_err(), "{text}");
        }
    }
}
