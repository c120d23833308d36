//! Random values: `password` and `pet_name`, drawn from the renderer's generator without bias.

use minijinja::value::{Rest, ValueOrKwargs};
use minijinja::{Error, Value};
use rand::Rng;

use super::args::{Args, fail};
use super::rng::{SharedRng, lock};

/// Longest `password` a template may ask for.
pub const MAX_PASSWORD_LEN: i64 = 1024;
/// Most words `pet_name` joins.
pub const MAX_PET_NAME_WORDS: i64 = 8;
/// The default `password` alphabet.
const ALPHANUMERIC: &str = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

/// A uniform index below `n` (`0 < n <= u32::MAX`), by rejection sampling: draws at or above the
/// largest multiple of `n` that fits in 32 bits are thrown away, so no index is favoured.
fn uniform_index(rng: &mut impl Rng, n: usize) -> usize {
    let n = u64::try_from(n).expect("n fits in u64");
    assert!(
        n > 0 && n <= u64::from(u32::MAX),
        "index bound out of range"
    );
    let zone = (1u64 << 32) / n * n;
    loop {
        let x = u64::from(rng.next_u32());
        if x < zone {
            return usize::try_from(x % n).expect("index fits in usize");
        }
    }
}
/// `password(len, alphabet?)`: `len` characters drawn uniformly and independently from the
/// distinct characters of `alphabet` (letters and digits by default).
pub(super) fn password(rng: &SharedRng, args: Rest<ValueOrKwargs>) -> Result<Value, Error> {
    let a = Args::bind("password", &["len", "alphabet"], args)?;
    let len = a.int_in(0, None, 1..=MAX_PASSWORD_LEN)?;
    let mut alphabet: Vec<char> = Vec::new();
    for c in a.opt_str(1)?.unwrap_or(ALPHANUMERIC).chars() {
        if !alphabet.contains(&c) {
            alphabet.push(c);
        }
    }
    if alphabet.len() < 2 {
        return Err(fail(
            "password",
            "`alphabet` needs at least 2 distinct characters",
        ));
    }
    let mut rng = lock(rng);
    let out: String = (0..len)
        .map(|_| alphabet[uniform_index(&mut *rng, alphabet.len())])
        .collect();
    Ok(Value::from(out))
}

/// `pet_name(words?, sep?)`: `words - 1` adjectives and an animal, joined by `sep`.
pub(super) fn pet_name(rng: &SharedRng, args: Rest<ValueOrKwargs>) -> Result<Value, Error> {
    let a = Args::bind("pet_name", &["words", "sep"], args)?;
    let words = a.int_in(0, Some(2), 1..=MAX_PET_NAME_WORDS)?;
    let sep = a.opt_str(1)?.unwrap_or("-");
    let mut rng = lock(rng);
    let mut parts: Vec<&str> = (1..words)
        .map(|_| ADJECTIVES[uniform_index(&mut *rng, ADJECTIVES.len())])
        .collect();
    parts.push(ANIMALS[uniform_index(&mut *rng, ANIMALS.len())]);
    Ok(Value::from(parts.join(sep)))
}

/// Adjectives for `pet_name`: lowercase ASCII, at most 8 letters, safe in DNS labels.
const ADJECTIVES: &[&str] = &[
    "able", "active", "agile", "amber", "ample", "azure", "bold", "brave", "bright", "brisk",
    "calm", "candid", "cheery", "civil", "clever", "cosmic", "cozy", "crisp", "curious", "daring",
    "dapper", "deft", "eager", "early", "easy", "epic", "exact", "fair", "famous", "fancy", "fast",
    "fine", "fit", "fluent", "fond", "free", "fresh", "frank", "gentle", "giant", "glad", "golden",
    "grand", "great", "happy", "hardy", "hearty", "honest", "humble", "ideal", "jolly", "just",
    "keen", "kind", "lively", "loyal", "lucky", "lunar", "merry", "mighty", "modest", "neat",
    "nimble", "noble", "polite", "proud", "quick", "quiet", "rapid", "ready", "robust", "rosy",
    "sharp", "shiny", "silent", "simple", "sincere", "smart", "snappy", "solar", "solid", "sound",
    "steady", "stellar", "sturdy", "sunny", "superb", "swift", "tender", "tidy", "tough", "trusty",
    "upbeat", "vast", "vivid", "warm", "wise", "witty", "young", "zesty",
];

/// Animals for `pet_name`: lowercase ASCII, at most 8 letters, safe in DNS labels.
const ANIMALS: &[&str] = &[
    "alpaca", "ant", "badger", "bat", "bear", "beaver", "bee", "bison", "boar", "bobcat", "camel",
    "carp", "cat", "cheetah", "cobra", "condor", "cougar", "coyote", "crab", "crane", "crow",
    "deer", "dingo", "dog", "dolphin", "donkey", "dove", "duck", "eagle", "eel", "elk", "emu",
    "falcon", "ferret", "finch", "fox", "frog", "gazelle", "gecko", "gibbon", "goat", "goose",
    "gopher", "heron", "horse", "hyena", "ibex", "ibis", "impala", "jackal", "jaguar", "koala",
    "krill", "lemur", "lion", "llama", "lynx", "magpie", "marten", "mink", "mole", "moose", "moth",
    "mouse", "mule", "newt", "ocelot", "orca", "oriole", "osprey", "otter", "owl", "ox", "panda",
    "panther", "parrot", "pelican", "penguin", "pika", "puffin", "puma", "quail", "rabbit",
    "raven", "robin", "salmon", "seal", "shark", "sloth", "snail", "sparrow", "squid", "stork",
    "swan", "tapir", "tiger", "toad", "trout", "turtle", "viper", "walrus", "wombat", "wren",
    "yak", "zebra",
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::functions::tests::{err, text};
    use crate::template::Renderer;
    use serde_json::json;

    // -- password ---------------------------------------------------------------------------

    #[test]
    fn password_has_the_length_and_alphabet_asked_for() {
        let pw = text("{{ password(32) }}");
        assert_eq!(pw.len(), 32);
        assert!(pw.chars().all(|c| c.is_ascii_alphanumeric()));
        let pw = text("{{ password(1024, 'xyz') }}");
        assert_eq!(pw.chars().count(), 1024);
        assert!(pw.chars().all(|c| "xyz".contains(c)));
        for c in ['x', 'y', 'z'] {
            assert!(pw.contains(c));
        }
        let pw = text("{{ password(64, 'αβγ!') }}");
        assert_eq!(pw.chars().count(), 64);
        assert!(pw.chars().all(|c| "αβγ!".contains(c)));
        assert_eq!(text("{{ password(1) }}").len(), 1);
    }

    #[test]
    fn password_rejects_bad_lengths_and_alphabets() {
        for expr in [
            "{{ password(0) }}",
            "{{ password(1025) }}",
            "{{ password(-1) }}",
            "{{ password('8') }}",
            "{{ password(2.5) }}",
        ] {
            assert_eq!(
                err(expr, json!({})),
                "password(): `len` must be an integer from 1 to 1024",
                "{expr}"
            );
        }
        for expr in [
            "{{ password(8, 'a') }}",
            "{{ password(8, 'aaaa') }}",
            "{{ password(8, '') }}",
        ] {
            assert!(
                err(expr, json!({})).contains("at least 2 distinct"),
                "{expr}"
            );
        }
        assert!(err("{{ password(8, 5) }}", json!({})).contains("`alphabet` must be a string"));
    }

    #[test]
    fn seeds_make_passwords_and_names_reproducible() {
        let tree = json!({"pw": "{{ password(24) }}", "name": "{{ pet_name(3) }}"});
        let a = Renderer::with_seed(7);
        let b = Renderer::with_seed(7);
        let first = a.render(&tree, &json!({})).unwrap();
        assert_eq!(first, b.render(&tree, &json!({})).unwrap());
        // Successive renders draw successive values, still in step.
        let second = a.render(&tree, &json!({})).unwrap();
        assert_ne!(first, second);
        assert_eq!(second, b.render(&tree, &json!({})).unwrap());
        let other = Renderer::with_seed(8).render(&tree, &json!({})).unwrap();
        assert_ne!(first["pw"], other["pw"]);
        // Unseeded renderers differ from each other.
        let x = Renderer::new().render(&tree, &json!({})).unwrap();
        let y = Renderer::new().render(&tree, &json!({})).unwrap();
        assert_ne!(x["pw"], y["pw"]);
    }

    /// Pearson's chi-square statistic of `counts` against a uniform distribution.
    fn chi_square(counts: &[u64]) -> f64 {
        let total: u64 = counts.iter().sum();
        let expected = total as f64 / counts.len() as f64;
        counts
            .iter()
            .map(|&c| (c as f64 - expected).powi(2) / expected)
            .sum()
    }

    #[test]
    fn password_characters_are_uniform_over_the_alphabet() {
        // 62 symbols (61 degrees of freedom: mean 61, sd 11); and a 7-symbol alphabet that does
        // not divide 2^32, where modulo reduction would be biased.
        for (alphabet, bound) in [
            (ALPHANUMERIC, 61.0 + 6.0 * 11.05),
            ("abcdefg", 6.0 + 6.0 * 3.5),
        ] {
            let r = Renderer::with_seed(42);
            let symbols: Vec<char> = alphabet.chars().collect();
            let mut counts = vec![0u64; symbols.len()];
            let mut first = vec![0u64; symbols.len()];
            for _ in 0..200 {
                let pw = r
                    .render(&json!("{{ password(1024, a) }}"), &json!({ "a": alphabet }))
                    .unwrap();
                let pw = pw.as_str().unwrap();
                for (i, c) in pw.chars().enumerate() {
                    let k = symbols.iter().position(|s| *s == c).unwrap();
                    counts[k] += 1;
                    if i == 0 {
                        first[k] += 1;
                    }
                }
            }
            let stat = chi_square(&counts);
            assert!(stat < bound, "chi-square {stat} over {alphabet}");
            assert!(counts.iter().all(|&c| c > 0));
        }
    }

    /// A generator that plays back fixed words, to watch rejection sampling at work.
    struct Script(Vec<u32>);

    impl rand::TryRng for Script {
        type Error = std::convert::Infallible;
        fn try_next_u32(&mut self) -> Result<u32, Self::Error> {
            Ok(self.0.remove(0))
        }
        fn try_next_u64(&mut self) -> Result<u64, Self::Error> {
            Ok(u64::from(self.0.remove(0)))
        }
        fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Self::Error> {
            dst.fill(0);
            Ok(())
        }
    }

    #[test]
    fn uniform_index_rejects_the_biased_tail() {
        // 2^32 = 3 * 1431655765 + 1: only u32::MAX falls outside the last whole block of 3.
        let mut rng = Script(vec![u32::MAX, u32::MAX, 4]);
        assert_eq!(uniform_index(&mut rng, 3), 1);
        assert!(rng.0.is_empty(), "both tail draws are rejected");
        // 2^32 = 62 * 69273666 + 4: the last four words are rejected, the one below is kept.
        let zone = (1u64 << 32) / 62 * 62;
        let mut rng = Script(vec![u32::MAX, u32::MAX - 3, (zone - 1) as u32]);
        assert_eq!(uniform_index(&mut rng, 62), ((zone - 1) % 62) as usize);
        assert!(rng.0.is_empty());
        // Powers of two never reject.
        let mut rng = Script(vec![u32::MAX]);
        assert_eq!(uniform_index(&mut rng, 64), 63);
    }

    // -- pet_name ---------------------------------------------------------------------------

    #[test]
    fn pet_names_are_adjectives_then_an_animal() {
        let name = text("{{ pet_name() }}");
        let (adj, animal) = name.split_once('-').unwrap();
        assert!(
            ADJECTIVES.contains(&adj) && ANIMALS.contains(&animal),
            "{name}"
        );
        assert!(ANIMALS.contains(&text("{{ pet_name(1) }}").as_str()));
        let name = text("{{ pet_name(4, sep='_') }}");
        let parts: Vec<&str> = name.split('_').collect();
        assert_eq!(parts.len(), 4);
        assert!(parts[..3].iter().all(|w| ADJECTIVES.contains(w)));
        assert!(ANIMALS.contains(&parts[3]));
        assert!(err("{{ pet_name(0) }}", json!({})).contains("from 1 to 8"));
        assert!(err("{{ pet_name(9) }}", json!({})).contains("from 1 to 8"));
    }

    #[test]
    fn pet_name_words_are_dns_safe_and_unique() {
        for list in [ADJECTIVES, ANIMALS] {
            let mut seen = std::collections::HashSet::new();
            for w in list {
                assert!(
                    w.len() <= 8 && w.bytes().all(|b| b.is_ascii_lowercase()),
                    "{w}"
                );
                assert!(seen.insert(w), "{w} twice");
            }
        }
    }
}
