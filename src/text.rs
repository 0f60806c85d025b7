//! Text assembled at compile time, so that start-up (dlock's hot path) does no work for it:
//! clap builds every help text on every run, and the lists in them come from the registry.
//!
//! A renderer is a `const fn(&mut [u8]) -> usize` that writes its text into the buffer when
//! it is long enough and returns the text's length either way; [`const_text!`] calls it once
//! to measure and once to write, giving a `&'static str`.

/// Copy `text` into `out` at `at` if it fits; the position after it either way.
pub const fn put(out: &mut [u8], at: usize, text: &str) -> usize {
    let bytes = text.as_bytes();
    if at + bytes.len() <= out.len() {
        let mut i = 0;
        while i < bytes.len() {
            out[at + i] = bytes[i];
            i += 1;
        }
    }
    at + bytes.len()
}

/// Write `n` in decimal, padded with spaces to `width`; the position after it.
pub const fn put_number(out: &mut [u8], at: usize, n: u8, width: usize) -> usize {
    let digits: [u8; 3] = [b'0' + n / 100, b'0' + n / 10 % 10, b'0' + n % 10];
    let first = if n >= 100 {
        0
    } else if n >= 10 {
        1
    } else {
        2
    };
    let mut end = at;
    let mut i = first;
    while i < 3 {
        if end < out.len() {
            out[end] = digits[i];
        }
        end += 1;
        i += 1;
    }
    while end < at + width {
        if end < out.len() {
            out[end] = b' ';
        }
        end += 1;
    }
    end
}

/// The `&'static str` a renderer (see the module doc) writes, built at compile time.
#[macro_export]
macro_rules! const_text {
    ($render:path) => {{
        const LEN: usize = $render(&mut []);
        const BYTES: [u8; LEN] = {
            let mut bytes = [0; LEN];
            $render(&mut bytes);
            bytes
        };
        match std::str::from_utf8(&BYTES) {
            Ok(text) => text,
            Err(_) => panic!("a compile-time text is not UTF-8"),
        }
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn sample(out: &mut [u8]) -> usize {
        let at = put(out, 0, "[");
        let at = put_number(out, at, 7, 4);
        let at = put_number(out, at, 124, 4);
        put(out, at, "]")
    }

    #[test]
    fn renders_text_and_padded_numbers() {
        const TEXT: &str = crate::const_text!(sample);
        assert_eq!(TEXT, "[7   124 ]");
    }
}
