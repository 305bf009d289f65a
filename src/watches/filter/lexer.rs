//! The lexer: the filter text to tokens, exactly where PostgreSQL would
//! split it, refusing lexical constructs the language leaves out.

use super::token::{is_blank, is_special, is_word_char, Tok, Token};
use super::{FilterError, MAX_EXPONENT, MAX_NUMBER_LEN};

/// would, refusing on the way the lexical constructs we never allow
/// (comments, variables, single quotes, odd escapes and numbers).
pub(super) struct Lexer {
    chars: Vec<char>,
    i: usize,
}

impl Lexer {
    pub(super) fn new(text: &str) -> Self {
        Lexer {
            chars: text.chars().collect(),
            i: 0,
        }
    }

    fn at(&self, k: usize) -> Option<char> {
        self.chars.get(self.i + k).copied()
    }

    pub(super) fn run(mut self) -> Result<Vec<Token>, FilterError> {
        let mut out = Vec::new();
        loop {
            while self.at(0).is_some_and(is_blank) {
                self.i += 1;
            }
            let pos = self.i + 1;
            let Some(c) = self.at(0) else {
                out.push(Token { tok: Tok::End, pos });
                return Ok(out);
            };
            let next = self.at(1);
            let (tok, width) = match c {
                '/' if next == Some('*') => {
                    return Err(FilterError::at(
                        "comments (`/* ... */`) are not allowed",
                        pos,
                    ));
                }
                '"' => {
                    let s = self.string()?;
                    out.push(Token {
                        tok: Tok::Str(s),
                        pos,
                    });
                    continue;
                }
                '\'' => {
                    return Err(FilterError::at(
                        "single-quoted strings are not allowed; use double quotes",
                        pos,
                    ));
                }
                '\\' => {
                    return Err(FilterError::at(
                        "a backslash is only allowed inside a double-quoted string",
                        pos,
                    ));
                }
                '$' if next == Some('"') || next.is_some_and(is_word_char) => {
                    return Err(FilterError::at(
                        "variables (`$name`) are not allowed; only `$` (the payload) and `@` \
                         (the current item in a filter)",
                        pos,
                    ));
                }
                '$' => (Tok::Root, 1),
                '@' => (Tok::Current, 1),
                '.' if next.is_some_and(|d| d.is_ascii_digit()) => {
                    return Err(FilterError::at(
                        "`.` followed by a digit is not allowed: write a number as `0.5`, \
                         an array index as `[1]`, a numeric key as `.\"1\"`",
                        pos,
                    ));
                }
                '.' => (Tok::Dot, 1),
                '[' => (Tok::LBracket, 1),
                ']' => (Tok::RBracket, 1),
                '(' => (Tok::LParen, 1),
                ')' => (Tok::RParen, 1),
                '?' => (Tok::Question, 1),
                ',' => (Tok::Comma, 1),
                '*' if next == Some('*') => (Tok::DoubleStar, 2),
                '*' => (Tok::Star, 1),
                '&' if next == Some('&') => (Tok::And, 2),
                '|' if next == Some('|') => (Tok::Or, 2),
                '!' if next == Some('=') => (Tok::Cmp("!="), 2),
                '!' => (Tok::Not, 1),
                '=' if next == Some('=') => (Tok::Cmp("=="), 2),
                '<' if next == Some('=') => (Tok::Cmp("<="), 2),
                '<' if next == Some('>') => (Tok::Cmp("<>"), 2),
                '<' => (Tok::Cmp("<"), 1),
                '>' if next == Some('=') => (Tok::Cmp(">="), 2),
                '>' => (Tok::Cmp(">"), 1),
                '+' => (Tok::Plus, 1),
                '-' => (Tok::Minus, 1),
                '/' => (Tok::Slash, 1),
                '%' => (Tok::Percent, 1),
                '0'..='9' => {
                    let n = self.number()?;
                    out.push(Token {
                        tok: Tok::Num(n),
                        pos,
                    });
                    continue;
                }
                c if is_special(c) => (Tok::Punct(c), 1),
                _ => {
                    let start = self.i;
                    while self.at(0).is_some_and(is_word_char) {
                        self.i += 1;
                    }
                    let w: String = self.chars[start..self.i].iter().collect();
                    out.push(Token {
                        tok: Tok::Word(w),
                        pos,
                    });
                    continue;
                }
            };
            self.i += width;
            out.push(Token { tok, pos });
        }
    }

    /// A number: JSON syntax (`0`, `-` is a separate token, `12`, `1.5`,
    /// `1e3`, `2.5E-3`), not followed by word characters or `.`. PostgreSQL
    /// also accepts `1.`, `.5` and `1.e3`; we refuse those rather than
    /// reason about them.
    fn number(&mut self) -> Result<String, FilterError> {
        let start = self.i;
        let pos = start + 1;
        let digit = |c: Option<char>| c.is_some_and(|c| c.is_ascii_digit());
        let malformed = |what: &str| {
            FilterError::at(
                format!("malformed number: {what}; numbers are written as in JSON"),
                pos,
            )
        };
        if self.at(0) == Some('0') {
            self.i += 1;
            if digit(self.at(0)) {
                return Err(malformed("leading zeros are not allowed"));
            }
        } else {
            while digit(self.at(0)) {
                self.i += 1;
            }
        }
        if self.at(0) == Some('.') {
            if !digit(self.at(1)) {
                return Err(malformed("a decimal point must be followed by digits"));
            }
            self.i += 1;
            while digit(self.at(0)) {
                self.i += 1;
            }
        }
        let mut exponent = 0u32;
        if matches!(self.at(0), Some('e' | 'E')) {
            let mut k = 1;
            if matches!(self.at(1), Some('+' | '-')) {
                k = 2;
            }
            if !digit(self.at(k)) {
                return Err(malformed("an exponent needs digits"));
            }
            self.i += k;
            while digit(self.at(0)) {
                let d = self.at(0).and_then(|c| c.to_digit(10)).unwrap_or(0);
                exponent = exponent.saturating_mul(10).saturating_add(d);
                self.i += 1;
            }
        }
        if self.at(0).is_some_and(|c| is_word_char(c) || c == '.') {
            return Err(malformed("unexpected characters right after it"));
        }
        let raw: String = self.chars[start..self.i].iter().collect();
        if raw.chars().count() > MAX_NUMBER_LEN {
            return Err(FilterError::at(
                format!("number literals may be at most {MAX_NUMBER_LEN} characters long"),
                pos,
            ));
        }
        if exponent > MAX_EXPONENT {
            return Err(FilterError::at(
                format!("number exponents may be at most {MAX_EXPONENT} in absolute value"),
                pos,
            ));
        }
        Ok(raw)
    }

    /// A double-quoted string, decoded the way PostgreSQL 15's scanner does,
    /// except that escapes PostgreSQL accepts by silently dropping the
    /// backslash (`\.` → `.`, `\d` → `d`) are refused: they never mean what
    /// the writer intended, least of all in a `like_regex` pattern.
    fn string(&mut self) -> Result<String, FilterError> {
        let open = self.i + 1;
        self.i += 1;
        let mut s = String::new();
        loop {
            let pos = self.i + 1;
            let Some(c) = self.at(0) else {
                return Err(FilterError::at("unterminated string literal", open));
            };
            match c {
                '"' => {
                    self.i += 1;
                    return Ok(s);
                }
                '\\' => {
                    let Some(e) = self.at(1) else {
                        return Err(FilterError::at("unterminated string literal", open));
                    };
                    self.i += 2;
                    match e {
                        '"' | '\'' | '\\' | '/' => s.push(e),
                        'b' => s.push('\u{8}'),
                        'f' => s.push('\u{c}'),
                        'n' => s.push('\n'),
                        'r' => s.push('\r'),
                        't' => s.push('\t'),
                        'v' => s.push('\u{b}'),
                        'x' => {
                            let h = self.hex_digits(2, 2, pos)?;
                            s.push(self.code_point(h, pos)?);
                        }
                        'u' => {
                            let cp = self.unicode_escape(pos)?;
                            if (0xD800..0xDC00).contains(&cp) {
                                // PostgreSQL pairs a high surrogate only with a
                                // low surrogate escape that follows immediately.
                                let low_pos = self.i + 1;
                                let low = if self.at(0) == Some('\\') && self.at(1) == Some('u') {
                                    self.i += 2;
                                    Some(self.unicode_escape(low_pos)?)
                                } else {
                                    None
                                };
                                match low {
                                    Some(low) if (0xDC00..0xE000).contains(&low) => {
                                        let cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
                                        s.push(self.code_point(cp, pos)?);
                                    }
                                    _ => {
                                        return Err(FilterError::at(
                                            "a \\u high surrogate must be followed directly by \
                                             a \\u low surrogate",
                                            pos,
                                        ));
                                    }
                                }
                            } else if (0xDC00..0xE000).contains(&cp) {
                                return Err(FilterError::at(
                                    "a \\u low surrogate must follow a high surrogate",
                                    pos,
                                ));
                            } else {
                                s.push(self.code_point(cp, pos)?);
                            }
                        }
                        other => {
                            return Err(FilterError::at(
                                format!(
                                    "string escape `\\{other}` is not allowed (PostgreSQL would \
                                     silently read it as `{other}`); to pass a backslash, e.g. to \
                                     like_regex, write `\\\\`"
                                ),
                                pos,
                            ));
                        }
                    }
                }
                c if c.is_control() => {
                    return Err(FilterError::at(
                        format!(
                            "raw control character U+{:04X} inside a string literal is not \
                             allowed; write it as an escape such as `\\n` or `\\t`",
                            c as u32
                        ),
                        pos,
                    ));
                }
                _ => {
                    s.push(c);
                    self.i += 1;
                }
            }
        }
    }

    /// After `\u`: four hex digits, or one to six in braces.
    fn unicode_escape(&mut self, pos: usize) -> Result<u32, FilterError> {
        if self.at(0) == Some('{') {
            self.i += 1;
            let v = self.hex_digits(1, 6, pos)?;
            if self.at(0) != Some('}') {
                return Err(FilterError::at("invalid \\u{...} escape", pos));
            }
            self.i += 1;
            Ok(v)
        } else {
            self.hex_digits(4, 4, pos)
        }
    }

    fn hex_digits(&mut self, min: usize, max: usize, pos: usize) -> Result<u32, FilterError> {
        let mut v = 0u32;
        let mut n = 0;
        while n < max {
            match self.at(0).and_then(|c| c.to_digit(16)) {
                Some(d) => {
                    v = v * 16 + d;
                    n += 1;
                    self.i += 1;
                }
                None => break,
            }
        }
        if n < min {
            return Err(FilterError::at(
                "invalid hexadecimal or unicode escape",
                pos,
            ));
        }
        Ok(v)
    }

    fn code_point(&self, cp: u32, pos: usize) -> Result<char, FilterError> {
        if cp == 0 {
            return Err(FilterError::at(
                "NUL characters (\\u0000) are not allowed in strings",
                pos,
            ));
        }
        char::from_u32(cp)
            .ok_or_else(|| FilterError::at(format!("invalid code point U+{cp:X} in escape"), pos))
    }
}
