//! The one definition [`Block`](crate::Block) and its twin tagged by name (`ByKind`, read by
//! [`crate::block_de`]) are both made from.

/// Defines `Block` from one definition, and beside it `ByKind`: the same variants and fields,
/// tagged by name outside (what serde's derive reads from an enum access), with the move from
/// one to the other.
macro_rules! block_kinds {
    (
        $(#[$meta:meta])*
        pub enum Block {
            $(
                $(#[$vmeta:meta])*
                $variant:ident {
                    $( $(#[$fmeta:meta])* $field:ident : $ty:ty ),* $(,)?
                }
            ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        pub enum Block {
            $( $(#[$vmeta])* $variant { $( $(#[$fmeta])* $field : $ty ),* } ),*
        }

        /// [`Block`] tagged by name outside: read by [`crate::block_de`] once it has the tag.
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "snake_case")]
        pub(crate) enum ByKind {
            $( $(#[$vmeta])* $variant { $( $(#[$fmeta])* $field : $ty ),* } ),*
        }

        /// [`Block`] read by serde's own derive (internally tagged, buffered): what the tests
        /// hold the tag-first reader to.
        #[cfg(test)]
        #[derive(Debug, serde::Deserialize)]
        #[serde(tag = "kind", rename_all = "snake_case")]
        pub(crate) enum Derived {
            $( $(#[$vmeta])* $variant { $( $(#[$fmeta])* $field : $ty ),* } ),*
        }

        #[cfg(test)]
        impl From<Derived> for Block {
            fn from(derived: Derived) -> Block {
                match derived {
                    $( Derived::$variant { $( $field ),* } => Block::$variant { $( $field ),* } ),*
                }
            }
        }

        impl From<ByKind> for Block {
            fn from(by_kind: ByKind) -> Block {
                match by_kind {
                    $( ByKind::$variant { $( $field ),* } => Block::$variant { $( $field ),* } ),*
                }
            }
        }
    };
}
pub(crate) use block_kinds;
