//! The recursive-descent parser: conditions (`&&`, `||`, `!`, comparisons,
//! `exists`, `starts with`, `like_regex`); paths are in [`path`].

mod path;

use super::regex::check_regex;
use super::token::{Tok, Token};
use super::{FilterError, MAX_CONDITIONS, MAX_DEPTH, MAX_REGEXES};

/// What an expression turned out to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Expr {
    /// A predicate (boolean condition).
    Pred,
    /// A path (`$...` or `@...`).
    Path,
    /// A literal.
    Lit,
}

/// Recursive-descent parser over the tokens. Every rule that recurses first
/// passes through [`Parser::enter`], which enforces [`MAX_DEPTH`], so the
/// recursion is bounded whatever the input.
pub(super) struct Parser {
    tokens: Vec<Token>,
    i: usize,
    depth: usize,
    steps: usize,
    wildcards: usize,
    filters: usize,
    conditions: usize,
    regexes: usize,
    /// What the filter costs to evaluate, in [`super::cost`]'s units.
    pub(super) cost: u64,
    in_filter: bool,
    in_exists: bool,
}

fn kw(tok: &Tok, keyword: &str) -> bool {
    matches!(tok, Tok::Word(w) if w.eq_ignore_ascii_case(keyword))
}

impl Parser {
    pub(super) fn new(tokens: Vec<Token>) -> Self {
        Parser {
            tokens,
            i: 0,
            depth: 0,
            steps: 0,
            wildcards: 0,
            filters: 0,
            conditions: 0,
            regexes: 0,
            cost: 0,
            in_filter: false,
            in_exists: false,
        }
    }

    pub(super) fn peek(&self) -> &Tok {
        self.peek_at(0)
    }

    fn peek_at(&self, k: usize) -> &Tok {
        // The token list always ends with `End`; stay on it.
        let last = self.tokens.len().saturating_sub(1);
        self.tokens
            .get((self.i + k).min(last))
            .map_or(&Tok::End, |t| &t.tok)
    }

    fn pos(&self) -> usize {
        let last = self.tokens.len().saturating_sub(1);
        self.tokens.get(self.i.min(last)).map_or(0, |t| t.pos)
    }

    pub(super) fn bump(&mut self) {
        if self.i + 1 < self.tokens.len() {
            self.i += 1;
        }
    }

    pub(super) fn err_here(&self, message: impl Into<String>) -> FilterError {
        FilterError::at(message, self.pos())
    }

    pub(super) fn unexpected(&self) -> FilterError {
        let what = self.peek().describe();
        match self.peek() {
            Tok::End => FilterError::new("unexpected end of the filter"),
            _ => self.err_here(format!("unexpected {what}")),
        }
    }

    fn expect(&mut self, tok: Tok, context: &str) -> Result<(), FilterError> {
        if *self.peek() == tok {
            self.bump();
            Ok(())
        } else {
            let found = self.peek().describe();
            Err(self.err_here(format!(
                "expected {} {context}, found {found}",
                tok.describe()
            )))
        }
    }

    fn enter(&mut self) -> Result<(), FilterError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(self.err_here(format!(
                "nesting is too deep: at most {MAX_DEPTH} levels of parentheses, `!(...)`, \
                 `exists(...)` and filters are allowed"
            )));
        }
        Ok(())
    }

    fn leave(&mut self) {
        self.depth -= 1;
    }

    fn count_condition(&mut self) -> Result<(), FilterError> {
        self.conditions += 1;
        self.cost += super::cost::CONDITION;
        if self.conditions > MAX_CONDITIONS {
            return Err(self.err_here(format!(
                "too many conditions: at most {MAX_CONDITIONS} comparisons, `starts with`, \
                 `like_regex` and `exists` are allowed"
            )));
        }
        Ok(())
    }

    /// `condition = and { "||" and }`
    pub(super) fn condition(&mut self) -> Result<Expr, FilterError> {
        let mut e = self.and()?;
        while *self.peek() == Tok::Or {
            Self::need_pred(e, "`||`", self.pos())?;
            self.bump();
            let r = self.and()?;
            Self::need_pred(r, "`||`", self.pos())?;
            e = Expr::Pred;
        }
        Ok(e)
    }

    /// `and = unary { "&&" unary }`
    fn and(&mut self) -> Result<Expr, FilterError> {
        let mut e = self.unary()?;
        while *self.peek() == Tok::And {
            Self::need_pred(e, "`&&`", self.pos())?;
            self.bump();
            let r = self.unary()?;
            Self::need_pred(r, "`&&`", self.pos())?;
            e = Expr::Pred;
        }
        Ok(e)
    }

    fn need_pred(e: Expr, op: &str, pos: usize) -> Result<(), FilterError> {
        match e {
            Expr::Pred => Ok(()),
            _ => Err(FilterError::at(
                format!(
                    "{op} combines conditions, but one side is a path or literal; compare it \
                     (`$.forced == true`) or test it with `exists(...)`"
                ),
                pos,
            )),
        }
    }

    fn unary(&mut self) -> Result<Expr, FilterError> {
        match self.peek() {
            Tok::Not => {
                self.bump();
                if *self.peek() == Tok::LParen {
                    self.group()?;
                } else if kw(self.peek(), "exists") {
                    self.exists()?;
                } else {
                    return Err(self.err_here(
                        "`!` must be followed by a parenthesised condition `!(...)` or by \
                         `exists(...)`",
                    ));
                }
                if kw(self.peek(), "is") {
                    return Err(self.err_here(
                        "`is unknown` can not follow `!(...)` (PostgreSQL rejects it); write \
                         `!((...) is unknown)`",
                    ));
                }
                Ok(Expr::Pred)
            }
            Tok::LParen => {
                self.group()?;
                if kw(self.peek(), "is") {
                    self.bump();
                    if !kw(self.peek(), "unknown") {
                        return Err(self.err_here("expected `unknown` after `is`"));
                    }
                    self.bump();
                }
                Ok(Expr::Pred)
            }
            t if kw(t, "exists") => {
                self.exists()?;
                if kw(self.peek(), "is") {
                    return Err(self.err_here(
                        "`is unknown` can only follow a parenthesised condition; write \
                         `(exists(...)) is unknown`",
                    ));
                }
                Ok(Expr::Pred)
            }
            _ => {
                let left_pos = self.pos();
                let left = self.operand()?;
                self.no_arithmetic_after()?;
                let t = self.peek().clone();
                if let Tok::Cmp(op) = t {
                    self.bump();
                    let right = self.operand()?;
                    self.no_arithmetic_after()?;
                    match (left, right) {
                        (Expr::Path, Expr::Lit) | (Expr::Lit, Expr::Path) => {}
                        (Expr::Path, Expr::Path) => {
                            return Err(FilterError::at(
                                format!(
                                    "comparing two paths (`{op}` with a path on both sides) is \
                                     not allowed: it compares every item with every item; \
                                     compare a path with a literal"
                                ),
                                left_pos,
                            ));
                        }
                        _ => {
                            return Err(FilterError::at(
                                format!(
                                    "`{op}` needs a path on one side and a literal on the other"
                                ),
                                left_pos,
                            ));
                        }
                    }
                    self.count_condition()?;
                    Ok(Expr::Pred)
                } else if kw(&t, "starts") {
                    self.bump();
                    if !kw(self.peek(), "with") {
                        return Err(self.err_here("expected `with` after `starts`"));
                    }
                    self.bump();
                    if left != Expr::Path {
                        return Err(FilterError::at(
                            "`starts with` needs a path on its left",
                            left_pos,
                        ));
                    }
                    match self.peek() {
                        Tok::Str(_) => self.bump(),
                        _ => {
                            return Err(self.err_here(
                                "`starts with` needs a double-quoted string literal on its right",
                            ));
                        }
                    }
                    self.count_condition()?;
                    Ok(Expr::Pred)
                } else if kw(&t, "like_regex") {
                    self.bump();
                    if left != Expr::Path {
                        return Err(FilterError::at(
                            "`like_regex` needs a path on its left",
                            left_pos,
                        ));
                    }
                    self.like_regex()?;
                    self.count_condition()?;
                    Ok(Expr::Pred)
                } else {
                    Ok(left)
                }
            }
        }
    }

    /// `"(" condition ")"`, which must contain a condition.
    fn group(&mut self) -> Result<(), FilterError> {
        self.enter()?;
        self.bump(); // `(`
        let inner_pos = self.pos();
        let e = self.condition()?;
        if e != Expr::Pred {
            return Err(FilterError::at(
                "parentheses may only group conditions, not paths or literals",
                inner_pos,
            ));
        }
        self.expect(Tok::RParen, "to close the parenthesis")?;
        self.leave();
        Ok(())
    }

    /// `"exists" "(" path ")"`
    fn exists(&mut self) -> Result<(), FilterError> {
        self.bump(); // `exists`
        if *self.peek() != Tok::LParen {
            return Err(self.err_here("expected `(` after `exists`"));
        }
        self.enter()?;
        self.bump();
        let was = std::mem::replace(&mut self.in_exists, true);
        let arg_pos = self.pos();
        let e = self.operand()?;
        self.no_arithmetic_after()?;
        self.in_exists = was;
        if e != Expr::Path {
            return Err(FilterError::at("`exists(...)` needs a path", arg_pos));
        }
        if *self.peek() != Tok::RParen {
            let found = self.peek().describe();
            return Err(self.err_here(format!(
                "expected `)` to close `exists(`, found {found}; `exists(...)` takes a path, \
                 not a condition"
            )));
        }
        self.bump();
        self.leave();
        self.count_condition()?;
        Ok(())
    }

    /// After `like_regex`: the pattern string and an optional `flag "..."`.
    fn like_regex(&mut self) -> Result<(), FilterError> {
        let pattern_pos = self.pos();
        let Tok::Str(pattern) = self.peek().clone() else {
            return Err(self.err_here("`like_regex` needs a double-quoted pattern"));
        };
        self.bump();
        let mut flags = String::new();
        if kw(self.peek(), "flag") {
            self.bump();
            let Tok::Str(f) = self.peek().clone() else {
                return Err(self.err_here("`flag` needs a double-quoted string of flags"));
            };
            flags = f;
            self.bump();
        }
        self.regexes += 1;
        if self.regexes > MAX_REGEXES {
            return Err(FilterError::at(
                format!("at most {MAX_REGEXES} `like_regex` conditions are allowed"),
                pattern_pos,
            ));
        }
        let weight = check_regex(&pattern, &flags).map_err(|m| FilterError::at(m, pattern_pos))?;
        // On top of the CONDITION that `count_condition` adds.
        self.cost += super::cost::like_regex(weight) - super::cost::CONDITION;
        Ok(())
    }

    /// Refuses arithmetic right after an operand (`$.a / 0`, `$.a + 1`).
    fn no_arithmetic_after(&self) -> Result<(), FilterError> {
        match self.peek() {
            Tok::Plus | Tok::Minus | Tok::Star | Tok::Slash | Tok::Percent => Err(self.err_here(
                format!("arithmetic ({}) is not allowed", self.peek().describe()),
            )),
            Tok::DoubleStar => Err(self.err_here("`**` is not allowed")),
            _ => Ok(()),
        }
    }
}
