//! `like_regex` patterns: the subset whose compiled automaton stays small.

use super::{MAX_REGEX_CI_RANGE, MAX_REGEX_LEN, MAX_REGEX_REPEAT, MAX_REGEX_WEIGHT};

/// Checks a `like_regex` pattern (already decoded from its jsonpath string)
/// and its flags. Returns a message (without prefix) if refused.
///
/// PostgreSQL uses its "advanced" (ARE) regex flavour. We accept a subset
/// whose compiled automaton is small and whose matching needs no
/// backtracking: literals, `.`, `^`, `$`, bracket expressions (with ranges
/// and `[:class:]`), groups `(...)` and `(?:...)`, `|`, the quantifiers
/// `* + ?` (optionally lazy) and counted repetitions up to
/// [`MAX_REGEX_REPEAT`], and the escapes `\d \D \s \S \w \W`, `\n \r \t \f
/// \v`, `\A \Z \m \M \y \Y` and backslash-punctuation. Refused:
/// back-references (`\1`), lookahead/lookbehind and embedded options
/// (`(?=`, `(?i)`), `***` directors, collating elements `[. .]` / `[= =]`
/// and the other escapes. With flag `q` the pattern is a literal string,
/// weighing one atom per character. Returns the pattern's weight.
pub(super) fn check_regex(pattern: &str, flags: &str) -> Result<u64, String> {
    for f in flags.chars() {
        match f {
            'i' | 's' | 'm' | 'q' => {}
            'x' => {
                return Err(
                    "like_regex flag `x` is not allowed (PostgreSQL does not implement \
                            expanded regular expressions in jsonpath); allowed flags are i, s, m \
                            and q"
                        .into(),
                );
            }
            c => {
                return Err(format!(
                    "like_regex flag `{}` is not allowed; allowed flags are i, s, m and q",
                    c.escape_debug()
                ));
            }
        }
    }
    let chars: Vec<char> = pattern.chars().collect();
    if chars.len() > MAX_REGEX_LEN {
        return Err(format!(
            "like_regex patterns may be at most {MAX_REGEX_LEN} characters long (this one has {})",
            chars.len()
        ));
    }
    if flags.contains('q') {
        // A literal string: PostgreSQL still compiles it into an automaton
        // with one state per character.
        return check_weight(chars.len() as u64);
    }
    if pattern.starts_with("***") {
        return Err("like_regex directors (`***:`, `***=`) are not allowed".into());
    }
    let mut re = Regex {
        p: chars,
        i: 0,
        case_insensitive: flags.contains('i'),
        ci_span: 0,
    };
    let weight = re.alternation()?;
    if re.i < re.p.len() {
        // `alternation` only stops early at an unmatched `)`.
        return Err("like_regex pattern has an unmatched `)`".into());
    }
    check_weight(weight)
}

/// Refuses a pattern heavier than [`MAX_REGEX_WEIGHT`]; returns the weight,
/// which is what a `like_regex` costs beyond its base (see [`super::cost`]).
fn check_weight(weight: u64) -> Result<u64, String> {
    if weight > MAX_REGEX_WEIGHT {
        return Err(format!(
            "like_regex pattern is too large once counted repetitions are expanded ({weight} \
             atoms; at most {MAX_REGEX_WEIGHT}): PostgreSQL's matcher tracks up to that many \
             states for every character it reads"
        ));
    }
    Ok(weight)
}

/// Cursor over a regex pattern for [`check_regex`]. Recursion happens only
/// at `(`, and the pattern is at most [`MAX_REGEX_LEN`] characters long.
struct Regex {
    p: Vec<char>,
    i: usize,
    case_insensitive: bool,
    /// Code points in all the character ranges so far; PostgreSQL case-folds
    /// each of them when it compiles a pattern with flag `i`.
    ci_span: u32,
}

impl Regex {
    fn at(&self, k: usize) -> Option<char> {
        self.p.get(self.i + k).copied()
    }

    /// `seq { "|" seq }`; returns the expanded weight.
    fn alternation(&mut self) -> Result<u64, String> {
        let mut w = self.sequence()?;
        while self.at(0) == Some('|') {
            self.i += 1;
            w = w.saturating_add(self.sequence()?);
        }
        Ok(w)
    }

    /// Quantified atoms up to `|`, `)` or the end.
    fn sequence(&mut self) -> Result<u64, String> {
        let mut w = 0u64;
        while let Some(c) = self.at(0) {
            if c == '|' || c == ')' {
                break;
            }
            let (atom, quantifiable) = self.atom()?;
            let mut factor = 1u64;
            if let Some(q @ ('*' | '+' | '?' | '{')) = self.at(0) {
                if !quantifiable {
                    return Err(
                        "like_regex: a quantifier can not follow an anchor or constraint \
                                (`^`, `$`, `\\A`, `\\y`, ...)"
                            .into(),
                    );
                }
                factor = match q {
                    '{' => self.bound()?,
                    '+' => {
                        self.i += 1;
                        2
                    }
                    _ => {
                        self.i += 1;
                        1
                    }
                };
                if self.at(0) == Some('?') {
                    self.i += 1; // lazy
                }
                if matches!(self.at(0), Some('*' | '+' | '?' | '{')) {
                    return Err("like_regex: a quantifier can not follow another quantifier".into());
                }
            }
            w = w.saturating_add(atom.saturating_mul(factor));
        }
        Ok(w)
    }

    /// One atom; returns its weight and whether a quantifier may follow it.
    fn atom(&mut self) -> Result<(u64, bool), String> {
        let Some(c) = self.at(0) else {
            return Err("like_regex pattern ended unexpectedly".into());
        };
        match c {
            '(' => {
                self.i += 1;
                if self.at(0) == Some('?') {
                    if self.at(1) != Some(':') {
                        return Err("like_regex: lookahead, lookbehind and embedded options \
                                    (`(?=`, `(?!`, `(?<=`, `(?i)`, ...) are not allowed; only \
                                    `(?:...)` groups"
                            .into());
                    }
                    self.i += 2;
                }
                let w = self.alternation()?;
                if self.at(0) != Some(')') {
                    return Err("like_regex pattern has an unmatched `(`".into());
                }
                self.i += 1;
                Ok((w.max(1), true))
            }
            '[' => {
                self.bracket()?;
                Ok((1, true))
            }
            '\\' => self.escape(),
            '^' | '$' => {
                self.i += 1;
                Ok((1, false))
            }
            '*' | '+' | '?' => Err(format!(
                "like_regex: quantifier `{c}` has nothing to repeat"
            )),
            '{' => Err(
                "like_regex: `{` must start a counted repetition `{m}`, `{m,}` or `{m,n}` \
                        after something to repeat; write a literal brace as `\\{`"
                    .into(),
            ),
            '}' => Err("like_regex: write a literal `}` as `\\}`".into()),
            _ => {
                self.i += 1;
                Ok((1, true))
            }
        }
    }

    /// `{m}`, `{m,}` or `{m,n}`; returns the weight factor.
    fn bound(&mut self) -> Result<u64, String> {
        self.i += 1; // `{`
        let bad = || {
            "like_regex: `{` must start a counted repetition `{m}`, `{m,}` or `{m,n}`; write a \
             literal brace as `\\{`"
                .to_string()
        };
        let m = self.digits().ok_or_else(bad)?;
        let mut n = Some(m);
        if self.at(0) == Some(',') {
            self.i += 1;
            n = self.digits();
        }
        if self.at(0) != Some('}') {
            return Err(bad());
        }
        self.i += 1;
        let top = n.unwrap_or(m).max(m);
        if top > u64::from(MAX_REGEX_REPEAT) {
            return Err(format!(
                "like_regex counted repetition `{{{top}}}` is too large: at most \
                 {MAX_REGEX_REPEAT} repetitions are allowed"
            ));
        }
        if let Some(n) = n.filter(|&n| n < m) {
            return Err(format!(
                "like_regex counted repetition `{{{m},{n}}}` is inverted"
            ));
        }
        Ok(match n {
            Some(n) => n.max(1),
            None => m + 1,
        })
    }

    fn digits(&mut self) -> Option<u64> {
        let mut v: Option<u64> = None;
        while let Some(d) = self.at(0).and_then(|c| c.to_digit(10)) {
            v = Some(
                v.unwrap_or(0)
                    .saturating_mul(10)
                    .saturating_add(u64::from(d)),
            );
            self.i += 1;
        }
        v
    }

    /// A backslash escape outside brackets.
    fn escape(&mut self) -> Result<(u64, bool), String> {
        let Some(e) = self.at(1) else {
            return Err("like_regex pattern ends with a lone backslash".into());
        };
        self.i += 2;
        match e {
            'd' | 'D' | 's' | 'S' | 'w' | 'W' | 'n' | 'r' | 't' | 'f' | 'v' => Ok((1, true)),
            'A' | 'Z' | 'm' | 'M' | 'y' | 'Y' => Ok((1, false)),
            '0'..='9' => Err(format!(
                "like_regex back-references and octal escapes (`\\{e}`) are not allowed"
            )),
            'b' => Err(
                "like_regex escape `\\b` is not allowed (in PostgreSQL it means backspace, \
                        not a word boundary; use `\\y` for a word boundary)"
                    .into(),
            ),
            c if c.is_ascii_punctuation() => Ok((1, true)),
            c => Err(format!(
                "like_regex escape `\\{}` is not allowed",
                c.escape_debug()
            )),
        }
    }

    /// A bracket expression `[...]`, starting at `[`.
    fn bracket(&mut self) -> Result<(), String> {
        self.i += 1;
        if self.at(0) == Some('^') {
            self.i += 1;
        }
        let mut first = true;
        loop {
            let Some(c) = self.at(0) else {
                return Err("like_regex pattern has an unmatched `[`".into());
            };
            if c == ']' && !first {
                self.i += 1;
                return Ok(());
            }
            let is_first = std::mem::replace(&mut first, false);
            // `lo` is Some(char) for an element that may start a range.
            let lo = match c {
                '[' => match self.at(1) {
                    Some(':') => {
                        self.posix_class()?;
                        None
                    }
                    Some('.' | '=') => {
                        return Err("like_regex: collating elements `[. .]` and equivalence \
                                    classes `[= =]` are not allowed"
                            .into());
                    }
                    _ => {
                        self.i += 1;
                        Some('[')
                    }
                },
                '\\' => {
                    let Some(e) = self.at(1) else {
                        return Err("like_regex pattern ends with a lone backslash".into());
                    };
                    match e {
                        'd' | 'D' | 's' | 'S' | 'w' | 'W' | 'n' | 'r' | 't' | 'f' | 'v' => {}
                        c if c.is_ascii_punctuation() => {}
                        c => {
                            return Err(format!(
                                "like_regex escape `\\{}` is not allowed inside `[...]`",
                                c.escape_debug()
                            ));
                        }
                    }
                    self.i += 2;
                    None
                }
                '-' if !is_first && self.at(1) != Some(']') => {
                    return Err(
                        "like_regex: inside `[...]` a literal `-` must come first or last".into(),
                    );
                }
                _ => {
                    self.i += 1;
                    Some(c)
                }
            };
            if self.at(0) == Some('-') && self.at(1).is_some_and(|h| h != ']') {
                let hi = self.at(1).unwrap_or(']');
                let Some(lo) = lo else {
                    return Err(
                        "like_regex: a character range must start with a plain character".into(),
                    );
                };
                if hi == '[' || hi == '\\' {
                    return Err(
                        "like_regex: a character range must end with a plain character".into(),
                    );
                }
                if hi < lo {
                    return Err(format!(
                        "like_regex: character range `{lo}-{hi}` is inverted"
                    ));
                }
                // `a-z` is 26 code points to fold, not 25.
                self.ci_span = self.ci_span.saturating_add(hi as u32 - lo as u32 + 1);
                if self.case_insensitive && self.ci_span > MAX_REGEX_CI_RANGE {
                    return Err(format!(
                        "like_regex: with flag `i`, the character ranges of a pattern may span \
                         at most {MAX_REGEX_CI_RANGE} characters in all"
                    ));
                }
                self.i += 2;
            }
        }
    }

    /// `[:name:]` inside a bracket expression, starting at its `[`.
    fn posix_class(&mut self) -> Result<(), String> {
        const CLASSES: [&str; 13] = [
            "alnum", "alpha", "blank", "cntrl", "digit", "graph", "lower", "print", "punct",
            "space", "upper", "xdigit", "word",
        ];
        let start = self.i + 2;
        let mut end = start;
        while end < self.p.len() && self.p[end] != ':' {
            end += 1;
        }
        let name: String = self.p[start..end.min(self.p.len())].iter().collect();
        if self.p.get(end + 1) != Some(&']') || !CLASSES.contains(&name.as_str()) {
            return Err(format!(
                "like_regex: unknown character class `[:{name}:]`; known classes are {}",
                CLASSES.join(", ")
            ));
        }
        self.i = end + 2;
        Ok(())
    }
}
