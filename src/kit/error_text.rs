//! A client library's error in words: the error and each of its causes, for messages.

use std::error::Error as StdError;

/// `e` and its causes, joined by ": ", leaving out a cause whose words the text already has
/// (libraries often repeat their source in their own message).
pub fn chain_text(e: &(dyn StdError + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let more = cause.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Layer(&'static str, Option<Box<Layer>>);

    impl std::fmt::Display for Layer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl StdError for Layer {
        fn source(&self) -> Option<&(dyn StdError + 'static)> {
            self.1.as_deref().map(|l| l as &(dyn StdError + 'static))
        }
    }

    #[test]
    fn causes_are_joined_once() {
        let e = Layer(
            "cannot connect: timed out",
            Some(Box::new(Layer(
                "timed out",
                Some(Box::new(Layer("os error 110", None))),
            ))),
        );
        assert_eq!(chain_text(&e), "cannot connect: timed out: os error 110");
    }
}
