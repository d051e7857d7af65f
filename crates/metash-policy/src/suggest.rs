//! "Did you mean ...?" for unknown manifest fields: the nearest valid name by edit distance.

/// The candidate closest to `word` (case-insensitive [`distance`]), if it is close enough to be a
/// plausible typo: at most a third of the longer word's length (at least 1 edit), or one word a
/// prefix of the other (`memory` for `mem`).
pub fn nearest<'a>(word: &str, candidates: &[&'a str]) -> Option<&'a str> {
    let word_l = word.to_ascii_lowercase();
    let close = candidates
        .iter()
        .map(|c| (distance(&word_l, &c.to_ascii_lowercase()), *c))
        .filter(|(d, c)| *d <= (word.len().max(c.len()) / 3).max(1))
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c);
    close.or_else(|| {
        candidates.iter().copied().find(|c| {
            let c_l = c.to_ascii_lowercase();
            c_l.len() >= 3
                && word_l.len() >= 3
                && (word_l.starts_with(&c_l) || c_l.starts_with(&word_l))
        })
    })
}

/// Edit distance over chars counting a swap of two neighbours as one edit (optimal string
/// alignment): `wsam` is one edit from `wasm`, as a typist would judge it.
pub fn distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let w = b.len() + 1;
    let mut d = vec![0usize; (a.len() + 1) * w];
    for i in 0..=a.len() {
        d[i * w] = i;
    }
    for (j, cell) in d.iter_mut().enumerate().take(w) {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut v = (d[(i - 1) * w + j] + 1)
                .min(d[i * w + j - 1] + 1)
                .min(d[(i - 1) * w + j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                v = v.min(d[(i - 2) * w + j - 2] + 1);
            }
            d[i * w + j] = v;
        }
    }
    d[a.len() * w + b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggests_close_names_only() {
        let names = ["capabilities", "oauth_scopes", "sandbox", "schema_version"];
        assert_eq!(nearest("capabilites", &names), Some("capabilities"));
        assert_eq!(nearest("sandbx", &names), Some("sandbox"));
        assert_eq!(nearest("schemaversion", &names), Some("schema_version"));
        assert_eq!(nearest("zzz", &names), None);
        assert_eq!(nearest("memory", &["cpu", "mem"]), Some("mem"));
        assert_eq!(distance("kitten", "sitting"), 3);
        assert_eq!(distance("wsam", "wasm"), 1);
    }
}
