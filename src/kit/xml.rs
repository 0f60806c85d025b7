//! What the HTTP backends read of their servers' XML (listings, error bodies): the texts of
//! the elements of a tag, in order, and XML's five escapes undone. The answers are flat and
//! never nest an element in one of the same tag, so this is all the parsing they need.

/// The texts inside each `<tag>…</tag>` of `xml`, in order.
pub fn elements<'a>(xml: &'a str, tag: &str) -> impl Iterator<Item = &'a str> + 'a {
    let open = format!("<{tag}>");
    let close = format!("</{tag}>");
    let mut rest = xml;
    std::iter::from_fn(move || {
        let start = rest.find(&open)? + open.len();
        let end = rest[start..].find(&close)? + start;
        let inner = &rest[start..end];
        rest = &rest[end + close.len()..];
        Some(inner)
    })
}

/// The text of the first `<tag>…</tag>` of `xml`.
pub fn element<'a>(xml: &'a str, tag: &str) -> Option<&'a str> {
    elements(xml, tag).next()
}

/// XML's five escapes undone (`&amp;` last, so that `&amp;lt;` stays `&lt;`).
pub fn unescape(text: &str) -> String {
    text.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&amp;", "&")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elements_are_read_in_order_and_unescaped() {
        let xml = "<R><K>a&amp;lt;b</K><X><K>c</K></X><K>unclosed";
        assert_eq!(elements(xml, "K").collect::<Vec<_>>(), ["a&amp;lt;b", "c"]);
        assert_eq!(element(xml, "X"), Some("<K>c</K>"));
        assert_eq!(element(xml, "Missing"), None);
        assert_eq!(element("<N />", "N"), None);
        assert_eq!(unescape("a&amp;lt;b &lt;&gt;&quot;&apos;"), "a&lt;b <>\"'");
    }
}
