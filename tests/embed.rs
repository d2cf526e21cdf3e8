//! The local embedder (all-MiniLM-L6-v2) batches texts by length; batching must not change what
//! a text embeds to, and its fast engine (AVX-512, bf16 products) must compute the model the
//! portable one (candle, f32) does.

use turnpike_index::embed::{normalized, Engine, MiniLm};
use turnpike_index::Embedder as _;
use turnpike_tests::index::{embedder, model_dir};

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_by_length_each_text_embeds_as_it_does_alone_and_in_its_place() {
    let embedder = embedder();
    // Lengths far apart, in no order: short queries beside abstract-sized texts.
    let long = "The boundary layer on a flat plate in supersonic flow was measured with \
                pitot probes and compared with the predictions of the momentum integral \
                method; agreement was good except near the leading edge, where the \
                interaction with the shock wave thickened the layer. "
        .repeat(3);
    let texts: Vec<String> = (0..40)
        .map(|i| match i % 4 {
            0 => format!("wing flutter {i}"),
            1 => format!("{long} sample {i}"),
            2 => format!("heat transfer to a cylinder in crossflow, case {i}"),
            _ => format!("{} {i}", &long[..long.len() / 3]),
        })
        .collect();
    let batched = embedder.embed(&texts).await.unwrap();
    assert_eq!(batched.len(), texts.len());
    for (i, text) in texts.iter().enumerate() {
        let alone = embedder
            .embed(std::slice::from_ref(text))
            .await
            .unwrap()
            .pop()
            .unwrap();
        let c = cosine(&normalized(alone), &batched[i]);
        assert!(c >= 0.999, "text {i}: cosine {c} against its own embedding");
    }
    // And each vector is its own text's, not a neighbour's in the sorted batch.
    assert!(cosine(&batched[0], &batched[1]) < 0.99);
}

/// Texts whose vectors, as the embedder made them before its matrix products could use
/// AVX-512, are kept in `tests/data/minilm_reference.json`.
const REFERENCE_TEXTS: &[&str] = &[
    "wing flutter",
    "what similarity laws must be obeyed when constructing aeroelastic models of heated high \
     speed aircraft",
    "experimental investigation of the aerodynamics of a wing in a slipstream. an experimental \
     study of a wing in a propeller slipstream was made in order to determine the spanwise \
     distribution of the lift increase due to slipstream at different angles of attack of the \
     wing and at different free stream to slipstream velocity ratios.",
    "Please check the order status for part number XJ-9000.",
    "ünïcödé, emoji 🚀 and a tab\tinside",
];

/// The embedder computes the same model however its kernels are built: every reference text
/// embeds to within cosine 0.999 of the vector it had before (set
/// `TURNPIKE_WRITE_EMBED_REFERENCE=1` to write the file instead, from a build taken as the
/// reference).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embeddings_stay_those_of_the_reference_build() {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/minilm_reference.json");
    let texts: Vec<String> = REFERENCE_TEXTS.iter().map(|t| (*t).to_owned()).collect();
    let vectors = embedder().embed(&texts).await.unwrap();
    if std::env::var_os("TURNPIKE_WRITE_EMBED_REFERENCE").is_some() {
        let json = serde_json::to_string(&vectors).unwrap();
        std::fs::write(&path, json).unwrap();
        return;
    }
    let reference: Vec<Vec<f32>> = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(reference.len(), texts.len());
    for (i, (now, then)) in vectors.iter().zip(&reference).enumerate() {
        assert_eq!(now.len(), then.len());
        let c = cosine(now, then);
        assert!(
            c >= 0.999,
            "text {i}: cosine {c} against the reference build's vector"
        );
    }
}

/// Abstract-sized texts in the style of the Cranfield collection, beside the edge cases of a
/// tokenizer: one word, nothing at all, more than the model's 256 tokens (cut), other scripts.
fn sample_texts() -> Vec<String> {
    let mut texts: Vec<String> = REFERENCE_TEXTS.iter().map(|t| (*t).to_owned()).collect();
    texts.extend(
        [
            "simple shear flow past a flat plate in an incompressible fluid of small viscosity. \
             in the study of high-speed viscous flow past a two-dimensional body it is usually \
             necessary to consider a curved shock wave emitting from the nose of the body.",
            "the theory of the impact tube at low pressure. a theoretical analysis of the \
             pressure indicated by an impact tube in a rarefied gas is presented, and the \
             results are compared with measurements in a low density wind tunnel.",
            "on the stability of the laminar boundary layer with suction, and the transition to \
             turbulence on a swept wing at transonic speeds, with a note on the effect of \
             surface roughness and of the pressure gradient along the span.",
            "heat",
            "",
            "Résumé: l'écoulement autour d'une aile en flèche; 翼の周りの流れ; поток вокруг крыла.",
        ]
        .map(str::to_owned),
    );
    texts.push(
        "a panel method for the lifting surface problem, solved by collocation at the \
         three-quarter chord points of every panel. "
            .repeat(20),
    );
    texts
}

/// Where the CPU runs the fast engine, it embeds every sample text to within cosine 0.999 of
/// the portable engine's vector, alone and in a batch (the fast engine computes each text
/// without padding, in threads); elsewhere asking for it is refused with a reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fast_engine_computes_the_portable_engines_vectors() {
    let dir = model_dir();
    let portable = MiniLm::load_on(&dir, Engine::Portable).unwrap();
    assert_eq!(portable.engine(), Engine::Portable);
    if !turnpike_index::embed::fast::supported() {
        let refused = MiniLm::load_on(&dir, Engine::Fast).err().expect("refused");
        assert!(refused.to_string().contains("AVX-512"), "{refused}");
        eprintln!("skipped the comparison: this CPU has no AVX-512 with bf16");
        return;
    }
    let fast = MiniLm::load_on(&dir, Engine::Fast).unwrap();
    assert_eq!(fast.engine(), Engine::Fast);
    let texts = sample_texts();
    let want = portable.embed(&texts).await.unwrap();
    let batched = fast.embed(&texts).await.unwrap();
    assert_eq!(batched.len(), texts.len());
    for (i, text) in texts.iter().enumerate() {
        let alone = fast.embed(std::slice::from_ref(text)).await.unwrap();
        assert_eq!(batched[i].len(), 384);
        let norm: f32 = batched[i].iter().map(|x| x * x).sum();
        assert!(
            (norm - 1.0).abs() < 1e-4,
            "text {i}: not unit length ({norm})"
        );
        for (how, got) in [("batched", &batched[i]), ("alone", &alone[0])] {
            let c = cosine(got, &want[i]);
            assert!(
                c >= 0.999,
                "text {i} {how}: cosine {c} against the portable engine"
            );
        }
    }
    // Each vector is its own text's: neighbours differ.
    for i in 1..texts.len() {
        assert!(
            cosine(&batched[i - 1], &batched[i]) < 0.99,
            "texts {} and {i}",
            i - 1
        );
    }
}
