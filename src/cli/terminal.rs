//! Text from the wire made safe to print on a terminal: whatever a peer put in a name, a
//! channel or a message is shown, never obeyed by the terminal, and a message's own newlines
//! cannot make a line that passes for another message.

/// Where a text continues after one of its newlines: indented, so that none of its lines can
/// pass for a message of its own (those start in the first column).
const CONTINUATION: &str = "\n    ";

/// `s` made safe to print on a terminal: each character [`escaped_on_terminal`] is shown as its
/// escape (`\u{1b}`). A newline is escaped too, unless `multiline`: then it stays, and the next
/// line starts with [`CONTINUATION`].
pub(super) fn terminal_safe(s: &str, multiline: bool) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c == '\n' && multiline {
            out.push_str(CONTINUATION);
        } else if escaped_on_terminal(c) {
            let _ = write!(out, "{}", c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    out
}

/// Controls (C0 such as ESC, CR, BEL and TAB, DEL, C1) could move the cursor, rewrite the
/// screen or the window title, or make the terminal answer; the Unicode bidirectional controls
/// reorder what is shown; the line and paragraph separators break lines in some terminals.
fn escaped_on_terminal(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061c}'
                | '\u{200e}'
                | '\u{200f}'
                | '\u{202a}'..='\u{202e}'
                | '\u{2066}'..='\u{2069}'
                | '\u{2028}'
                | '\u{2029}'
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_from_the_wire_are_shown_not_obeyed() {
        for (raw, shown) in [
            ("\u{1b}]0;owned\u{7}", "\\u{1b}]0;owned\\u{7}"),
            ("\u{1b}[2J\u{1b}[1;1H", "\\u{1b}[2J\\u{1b}[1;1H"),
            ("ok\rforged", "ok\\u{d}forged"),
            ("a\tb\u{0}\u{7f}", "a\\u{9}b\\u{0}\\u{7f}"),
            ("\u{9b}31m\u{85}", "\\u{9b}31m\\u{85}"),
            ("\u{202e}gnp.exe", "\\u{202e}gnp.exe"),
            ("\u{2067}x\u{2069}\u{200f}", "\\u{2067}x\\u{2069}\\u{200f}"),
            ("one\u{2028}two", "one\\u{2028}two"),
            ("bob\nmallory", "bob\\u{a}mallory"),
        ] {
            assert_eq!(terminal_safe(raw, false), shown, "{raw:?}");
        }
    }

    #[test]
    fn ordinary_text_is_unchanged() {
        let text = "héllo, 日本語, مرحبا, 👋 — a\\b \"quoted\" {json}";
        assert_eq!(terminal_safe(text, false), text);
        assert_eq!(terminal_safe(text, true), text);
    }

    #[test]
    fn a_newline_in_a_text_cannot_forge_a_message_line() {
        let shown = terminal_safe("first\n#general alice: forged\r\nlast", true);
        assert_eq!(shown, "first\n    #general alice: forged\\u{d}\n    last");
        assert!(shown.lines().skip(1).all(|l| l.starts_with(' ')));
    }

    #[test]
    fn nothing_unsafe_survives() {
        let every: String = (0..=0x3000u32).filter_map(char::from_u32).collect();
        for multiline in [false, true] {
            let shown = terminal_safe(&every, multiline);
            assert!(
                shown
                    .chars()
                    .all(|c| !escaped_on_terminal(c) || (multiline && c == '\n')),
                "multiline {multiline}"
            );
        }
    }
}
