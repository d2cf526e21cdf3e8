//! The canonical form an approval binds to: object keys sorted, numbers normalised (an integral
//! float is an integer: `1.0` → `1`; other floats keep their shortest round-trip form), so two
//! spellings of the same call are one call.

use serde_json::{Map, Number, Value};

/// The canonical form of a JSON value (see the module docs).
pub fn canonical(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            let mut out = Map::new();
            for k in keys {
                out.insert(k.clone(), canonical(&map[k]));
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(items.iter().map(canonical).collect()),
        Value::Number(n) => Value::Number(canonical_number(n)),
        other => other.clone(),
    }
}

fn canonical_number(n: &Number) -> Number {
    if n.is_i64() || n.is_u64() {
        return n.clone();
    }
    match n.as_f64() {
        Some(f) if f.fract() == 0.0 && f.abs() < 9.007_199_254_740_992e15 => Number::from(f as i64),
        Some(f) => Number::from_f64(f).unwrap_or_else(|| n.clone()),
        None => n.clone(),
    }
}

/// The canonical text of a value: keys sorted at every level, whatever the map type.
pub fn canonical_string(value: &Value) -> String {
    let mut out = String::new();
    write_canonical(&canonical(value), &mut out);
    out
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                write_canonical(&map[k], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(v, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}
