//! "Did you mean ...?" for unknown manifest fields: the nearest valid name by edit distance.

/// The candidate closest to `word` (Levenshtein, case-insensitive), if it is close enough to be a
/// plausible typo: at most a third of the longer word's length, and at least 1 edit allowed.
pub fn nearest<'a>(word: &str, candidates: &[&'a str]) -> Option<&'a str> {
    let word_l = word.to_ascii_lowercase();
    candidates
        .iter()
        .map(|c| (distance(&word_l, &c.to_ascii_lowercase()), *c))
        .filter(|(d, c)| *d <= (word.len().max(c.len()) / 3).max(1))
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// Levenshtein distance over chars, two rows.
pub fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for (i, ca) in a.chars().enumerate() {
        cur[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != *cb);
            cur[j + 1] = (prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
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
        assert_eq!(distance("kitten", "sitting"), 3);
    }
}
