//! Paths: `$` and `@` with their steps (keys, wildcards, indexes, the one
//! filter), and the operands they appear in.

use super::{kw, Expr, Parser};
use crate::watches::filter::token::Tok;
use crate::watches::filter::{FilterError, MAX_FILTERS, MAX_INDEX, MAX_STEPS, MAX_WILDCARDS};

impl Parser {
    /// A path (`$…` at top level, `@…` inside a filter) or a literal.
    pub(super) fn operand(&mut self) -> Result<Expr, FilterError> {
        let t = self.peek().clone();
        match t {
            Tok::Root => {
                if self.in_filter {
                    let where_ = if self.in_exists {
                        ", not even in `exists(...)`"
                    } else {
                        ""
                    };
                    return Err(self.err_here(format!(
                        "`$` is not allowed inside a filter `? (...)`{where_}; use `@` to refer \
                         to the current item (`$` there re-reads the whole payload for every item)"
                    )));
                }
                self.bump();
                self.steps()?;
                Ok(Expr::Path)
            }
            Tok::Current => {
                if !self.in_filter {
                    return Err(self.err_here(
                        "`@` is only allowed inside a filter `? (...)`; outside one, paths start \
                         with `$`",
                    ));
                }
                self.bump();
                self.steps()?;
                Ok(Expr::Path)
            }
            Tok::Str(_) | Tok::Num(_) => {
                self.bump();
                Ok(Expr::Lit)
            }
            Tok::Plus | Tok::Minus => {
                if matches!(self.peek_at(1), Tok::Num(_)) {
                    self.bump();
                    self.bump();
                    Ok(Expr::Lit)
                } else {
                    Err(self.err_here(format!(
                        "arithmetic (unary {}) is not allowed; a sign may only precede a number",
                        t.describe()
                    )))
                }
            }
            Tok::Word(ref w) => {
                if w == "true" || w == "false" || w == "null" {
                    self.bump();
                    return Ok(Expr::Lit);
                }
                let lower = w.to_ascii_lowercase();
                match lower.as_str() {
                    "true" | "false" | "null" => Err(self.err_here(format!(
                        "`{w}` is not a literal: true, false and null must be lowercase"
                    ))),
                    "last" => {
                        Err(self.err_here("`last` is only allowed as an array index `[last]`"))
                    }
                    "strict" | "lax" => {
                        Err(self.err_here(format!("`{w}` may only appear at the very start")))
                    }
                    "like_regex" | "starts" => {
                        Err(self.err_here(format!("`{w}` needs a path on its left")))
                    }
                    _ => Err(self.err_here(format!(
                        "unexpected word `{w}`: paths start with `$` (or `@` inside a filter) \
                         and strings are double-quoted"
                    ))),
                }
            }
            Tok::DoubleStar => Err(self.err_here("`**` is not allowed")),
            Tok::Star | Tok::Slash | Tok::Percent => {
                Err(self.err_here(format!("arithmetic ({}) is not allowed", t.describe())))
            }
            Tok::LParen => {
                Err(self.err_here("parentheses may only group conditions, not paths or literals"))
            }
            _ => Err(self.unexpected()),
        }
    }

    /// The steps after `$` or `@`.
    fn steps(&mut self) -> Result<(), FilterError> {
        loop {
            let step_pos = self.pos();
            match self.peek().clone() {
                Tok::Dot => {
                    self.bump();
                    match self.peek().clone() {
                        Tok::Word(w) => {
                            if *self.peek_at(1) == Tok::LParen {
                                return Err(
                                    self.err_here(format!("item method `.{w}()` is not allowed"))
                                );
                            }
                            if !is_plain_key(&w) {
                                return Err(self.err_here(format!(
                                    "unquoted key `{w}` is not allowed: unquoted keys are \
                                     [A-Za-z_][A-Za-z0-9_]*; quote others as `.\"{w}\"`"
                                )));
                            }
                            self.bump();
                        }
                        Tok::Str(_) => self.bump(),
                        Tok::Star => {
                            self.bump();
                            self.count_wildcard(step_pos)?;
                        }
                        Tok::DoubleStar => {
                            return Err(FilterError::at(
                                "`.**` (recursive descent, any level) is not allowed",
                                step_pos,
                            ));
                        }
                        _ => {
                            let found = self.peek().describe();
                            return Err(self.err_here(format!(
                                "expected a key, `\"quoted key\"` or `*` after `.`, found {found}"
                            )));
                        }
                    }
                }
                Tok::LBracket => {
                    self.bump();
                    self.index(step_pos)?;
                }
                Tok::Question => {
                    if self.in_filter {
                        return Err(self.err_here(
                            "nested filters are not allowed: a filter `? (...)` can not contain \
                             another filter",
                        ));
                    }
                    if self.filters >= MAX_FILTERS {
                        return Err(self.err_here(format!(
                            "at most {MAX_FILTERS} filter `? (...)` is allowed per match"
                        )));
                    }
                    self.filters += 1;
                    self.bump();
                    if *self.peek() != Tok::LParen {
                        return Err(self.err_here("expected `(` after the filter `?`"));
                    }
                    self.enter()?;
                    self.bump();
                    self.in_filter = true;
                    let cond_pos = self.pos();
                    let e = self.condition()?;
                    if e != Expr::Pred {
                        return Err(FilterError::at(
                            "a filter `? (...)` needs a condition such as `@ == \"x\"` or \
                             `exists(@.x)`, not a path or literal",
                            cond_pos,
                        ));
                    }
                    self.expect(Tok::RParen, "to close the filter `? (`")?;
                    self.in_filter = false;
                    self.leave();
                }
                _ => return Ok(()),
            }
            self.steps += 1;
            if self.steps > MAX_STEPS {
                return Err(FilterError::at(
                    format!("too many path steps: at most {MAX_STEPS} are allowed in a filter"),
                    step_pos,
                ));
            }
        }
    }

    fn count_wildcard(&mut self, pos: usize) -> Result<(), FilterError> {
        self.wildcards += 1;
        if self.wildcards > MAX_WILDCARDS {
            return Err(FilterError::at(
                format!(
                    "too many wildcard steps (`[*]`, `.*`): at most {MAX_WILDCARDS} are allowed"
                ),
                pos,
            ));
        }
        Ok(())
    }

    /// After `[`: `*`, a non-negative integer or `last`, then `]`.
    fn index(&mut self, step_pos: usize) -> Result<(), FilterError> {
        match self.peek().clone() {
            Tok::Star => {
                self.bump();
                self.count_wildcard(step_pos)?;
            }
            Tok::Num(n) => {
                let ok = n.chars().all(|c| c.is_ascii_digit())
                    && n.parse::<u64>().is_ok_and(|v| v <= u64::from(MAX_INDEX));
                if !ok {
                    return Err(self.err_here(format!(
                        "array index `{n}` is not allowed: indexes are integers from 0 to \
                         {MAX_INDEX}"
                    )));
                }
                self.bump();
            }
            t if kw(&t, "last") => self.bump(),
            Tok::Minus => {
                return Err(self.err_here("negative array indexes are not allowed"));
            }
            Tok::Root | Tok::Current => {
                return Err(self.err_here(
                    "computed array indexes are not allowed; use an integer, `last` or `*`",
                ));
            }
            _ => {
                let found = self.peek().describe();
                return Err(self.err_here(format!(
                    "expected an array index (an integer, `last` or `*`), found {found}"
                )));
            }
        }
        match self.peek() {
            Tok::RBracket => {
                self.bump();
                Ok(())
            }
            t if kw(t, "to") => Err(self.err_here("array slices (`[a to b]`) are not allowed")),
            Tok::Comma => Err(self.err_here("index lists (`[a, b]`) are not allowed")),
            Tok::Plus | Tok::Minus | Tok::Star | Tok::Slash | Tok::Percent => {
                Err(self.err_here(format!(
                    "arithmetic ({}) in an array index (such as `last - 1`) is not allowed",
                    self.peek().describe()
                )))
            }
            _ => {
                let found = self.peek().describe();
                Err(self.err_here(format!("expected `]`, found {found}")))
            }
        }
    }
}

/// An unquoted key: `[A-Za-z_][A-Za-z0-9_]*`. PostgreSQL accepts far more
/// (any run of non-special characters); requiring quotes for the rest keeps
/// what the reader sees and what PostgreSQL sees the same.
fn is_plain_key(w: &str) -> bool {
    let mut chars = w.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}
