//! Tokens: the character classes PostgreSQL's jsonpath scanner splits on,
//! and what the lexer produces.

/// Whitespace that separates tokens. PostgreSQL also accepts form feed, but
/// it is a control character and refused.
pub(super) fn is_blank(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\r')
}

/// PostgreSQL's jsonpath `special` characters: each is a token on its own
/// (or part of a two-character operator) and ends an unquoted word.
pub(super) fn is_special(c: char) -> bool {
    matches!(
        c,
        '?' | '%'
            | '$'
            | '.'
            | '['
            | ']'
            | '{'
            | '}'
            | '('
            | ')'
            | '|'
            | '&'
            | '!'
            | '='
            | '<'
            | '>'
            | '@'
            | '#'
            | ','
            | '*'
            | ':'
            | '-'
            | '+'
            | '/'
    )
}

/// PostgreSQL's `any` class: characters that make up unquoted words
/// (identifiers, keywords, `$variables`). Reading words with exactly this
/// class keeps our token boundaries identical to PostgreSQL's.
pub(super) fn is_word_char(c: char) -> bool {
    !is_special(c) && !matches!(c, '\\' | '"' | '\'' | ' ' | '\t' | '\n' | '\r' | '\x0c')
}

#[derive(Debug, Clone, PartialEq)]
pub(super) enum Tok {
    Root,
    Current,
    Dot,
    LBracket,
    RBracket,
    LParen,
    RParen,
    Question,
    Star,
    /// `**`, which PostgreSQL always lexes as the recursive-descent token.
    DoubleStar,
    Comma,
    And,
    Or,
    Not,
    Cmp(&'static str),
    Plus,
    Minus,
    Slash,
    Percent,
    /// A double-quoted string, decoded.
    Str(String),
    /// A number literal, as written (already checked to be a JSON number).
    Num(String),
    /// An unquoted word: identifier or keyword.
    Word(String),
    /// A special character with no use in the allowed language.
    Punct(char),
    End,
}

impl Tok {
    pub(super) fn describe(&self) -> String {
        match self {
            Tok::Root => "`$`".into(),
            Tok::Current => "`@`".into(),
            Tok::Dot => "`.`".into(),
            Tok::LBracket => "`[`".into(),
            Tok::RBracket => "`]`".into(),
            Tok::LParen => "`(`".into(),
            Tok::RParen => "`)`".into(),
            Tok::Question => "`?`".into(),
            Tok::Star => "`*`".into(),
            Tok::DoubleStar => "`**`".into(),
            Tok::Comma => "`,`".into(),
            Tok::And => "`&&`".into(),
            Tok::Or => "`||`".into(),
            Tok::Not => "`!`".into(),
            Tok::Cmp(op) => format!("`{op}`"),
            Tok::Plus => "`+`".into(),
            Tok::Minus => "`-`".into(),
            Tok::Slash => "`/`".into(),
            Tok::Percent => "`%`".into(),
            Tok::Str(_) => "a string literal".into(),
            Tok::Num(n) => format!("number `{n}`"),
            Tok::Word(w) => format!("`{w}`"),
            Tok::Punct(c) => format!("`{c}`"),
            Tok::End => "the end of the filter".into(),
        }
    }
}

pub(super) struct Token {
    pub(super) tok: Tok,
    /// 1-based character position of the token's first character.
    pub(super) pos: usize,
}
