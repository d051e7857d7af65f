//! A small Rust tokenizer, enough to read module structure and paths: comments dropped, string
//! and character literals kept as one opaque token each (so a path inside a string or a comment
//! is never taken for a reference), `::` one token, every other symbol one character.

/// What a token is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// An identifier, keyword or number.
    Ident,
    /// A string, byte string or character literal (its text kept, quotes included).
    Literal,
    /// `::` or one symbol.
    Punct,
}

/// One token and the line it starts on (1-based).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tok {
    pub kind: Kind,
    pub text: String,
    pub line: usize,
}

impl Tok {
    pub fn is(&self, text: &str) -> bool {
        self.text == text && self.kind != Kind::Literal
    }

    pub fn ident(&self) -> Option<&str> {
        (self.kind == Kind::Ident).then_some(self.text.as_str())
    }
}

struct Lexer {
    c: Vec<char>,
    i: usize,
    line: usize,
    out: Vec<Tok>,
}

/// The tokens of `src`.
pub fn tokens(src: &str) -> Vec<Tok> {
    let mut lx = Lexer {
        c: src.chars().collect(),
        i: 0,
        line: 1,
        out: Vec::new(),
    };
    while lx.i < lx.c.len() {
        lx.step();
    }
    lx.out
}

impl Lexer {
    fn at(&self, k: usize) -> Option<char> {
        self.c.get(self.i + k).copied()
    }

    /// Moves past one character, counting lines.
    fn bump(&mut self) {
        if self.at(0) == Some('\n') {
            self.line += 1;
        }
        self.i += 1;
    }

    fn push(&mut self, kind: Kind, from: usize, line: usize) {
        let text = self.c[from..self.i.min(self.c.len())].iter().collect();
        self.out.push(Tok { kind, text, line });
    }

    fn step(&mut self) {
        let (ch, from, line) = (self.c[self.i], self.i, self.line);
        match (ch, self.at(1)) {
            (c, _) if c.is_whitespace() => self.bump(),
            ('/', Some('/')) => {
                while self.at(0).is_some_and(|c| c != '\n') {
                    self.bump();
                }
            }
            ('/', Some('*')) => self.block_comment(),
            ('"', _) => {
                self.quoted('"');
                self.push(Kind::Literal, from, line);
            }
            // A character literal ('a', '\n', '\''); otherwise a lifetime or label ('a).
            ('\'', next) if next == Some('\\') || self.at(2) == Some('\'') => {
                self.quoted('\'');
                self.push(Kind::Literal, from, line);
            }
            (':', Some(':')) => {
                self.i += 2;
                self.push(Kind::Punct, from, line);
            }
            (c, _) if c.is_alphanumeric() || c == '_' => {
                if !self.raw_string() {
                    while self.at(0).is_some_and(|c| c.is_alphanumeric() || c == '_') {
                        self.bump();
                    }
                    self.push(Kind::Ident, from, line);
                }
            }
            _ => {
                self.bump();
                self.push(Kind::Punct, from, line);
            }
        }
    }

    /// A `/* */` comment, nested ones included.
    fn block_comment(&mut self) {
        let mut depth = 0usize;
        while let Some(c) = self.at(0) {
            if c == '/' && self.at(1) == Some('*') {
                depth += 1;
                self.i += 2;
            } else if c == '*' && self.at(1) == Some('/') {
                self.i += 2;
                depth -= 1;
                if depth == 0 {
                    return;
                }
            } else {
                self.bump();
            }
        }
    }

    /// From an opening quote to its closing one, honouring backslash escapes.
    fn quoted(&mut self, q: char) {
        self.bump();
        while let Some(c) = self.at(0) {
            if c == '\\' {
                self.bump();
                self.bump();
            } else if c == q {
                self.bump();
                return;
            } else {
                self.bump();
            }
        }
    }

    /// `r"…"`, `r#"…"#`, `br"…"`, `cr#"…"#` at the cursor: consumed as one literal (true).
    fn raw_string(&mut self) -> bool {
        let (from, line) = (self.i, self.line);
        let mut k = usize::from(matches!(self.at(0), Some('b' | 'c')) && self.at(1) == Some('r'));
        if self.at(k) != Some('r') {
            return false;
        }
        k += 1;
        let mut hashes = 0;
        while self.at(k) == Some('#') {
            hashes += 1;
            k += 1;
        }
        if self.at(k) != Some('"') {
            return false;
        }
        for _ in 0..=k {
            self.bump();
        }
        while self.at(0).is_some() {
            if self.at(0) == Some('"') && (1..=hashes).all(|h| self.at(h) == Some('#')) {
                for _ in 0..=hashes {
                    self.bump();
                }
                break;
            }
            self.bump();
        }
        self.push(Kind::Literal, from, line);
        true
    }
}
