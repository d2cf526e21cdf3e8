//! The one error shape of the crates that do I/O: a kind the caller matches on, a message that
//! says what was wrong, and the source. [`error_type!`](crate::error_type) defines it in a crate
//! for that crate's kind enum (so `?` conversions between crates stay local `From` impls); each
//! crate adds its own constructors in an `impl Error` of its own.

/// Defines `pub struct Error` (kind, message, source), its `new`, `with_source`, `kind`,
/// `source_as`, `Display` (the message) and `std::error::Error` (the source), and
/// `pub type Result<T, E = Error>`, for the kind enum `$kind` of the calling crate.
#[macro_export]
macro_rules! error_type {
    ($kind:ty) => {
        /// An error: a kind, a message that says what was wrong, and the source.
        #[derive(Debug)]
        pub struct Error {
            kind: $kind,
            message: String,
            source: Option<Box<dyn std::error::Error + Send + Sync>>,
        }

        impl Error {
            /// An error of `kind` that says `message`.
            pub fn new(kind: $kind, message: impl Into<String>) -> Self {
                Self {
                    kind,
                    message: message.into(),
                    source: None,
                }
            }

            /// An error of `kind` that says `message`, caused by `source`.
            pub fn with_source(
                kind: $kind,
                message: impl Into<String>,
                source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
            ) -> Self {
                Self {
                    kind,
                    message: message.into(),
                    source: Some(source.into()),
                }
            }

            /// The kind of failure.
            pub fn kind(&self) -> $kind {
                self.kind
            }

            /// The source, if it is an `E`.
            pub fn source_as<E: std::error::Error + 'static>(&self) -> Option<&E> {
                self.source.as_deref()?.downcast_ref::<E>()
            }

            /// The source, taken out of the error.
            pub fn into_source(self) -> Option<Box<dyn std::error::Error + Send + Sync>> {
                self.source
            }
        }

        impl std::fmt::Display for Error {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.message)
            }
        }

        impl std::error::Error for Error {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                self.source
                    .as_deref()
                    .map(|e| e as &(dyn std::error::Error + 'static))
            }
        }

        /// This crate's result type.
        pub type Result<T, E = Error> = std::result::Result<T, E>;
    };
}

#[cfg(test)]
mod tests {
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Kind {
        Gone,
    }

    crate::error_type!(Kind);

    #[derive(Debug)]
    struct Cause;

    impl std::fmt::Display for Cause {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("the cause")
        }
    }

    impl std::error::Error for Cause {}

    #[test]
    fn an_error_says_its_message_keeps_its_kind_and_hands_out_its_source() {
        let e = Error::with_source(Kind::Gone, "it is gone", Cause);
        assert_eq!(e.to_string(), "it is gone");
        assert_eq!(e.kind(), Kind::Gone);
        assert!(e.source_as::<Cause>().is_some());
        assert_eq!(
            std::error::Error::source(&e).map(|s| s.to_string()),
            Some("the cause".into())
        );
        assert!(Error::new(Kind::Gone, "x").source_as::<Cause>().is_none());
        assert!(Error::new(Kind::Gone, "x").into_source().is_none());
        let _: Result<()> = Err(e);
        let taken = Error::with_source(Kind::Gone, "it is gone", Cause).into_source();
        assert!(taken.unwrap().downcast::<Cause>().is_ok());
    }
}
