//! The local embedder (all-MiniLM-L6-v2 in candle) batches texts by length; batching must not
//! change what a text embeds to.

use turnpike_index::embed::normalized;
use turnpike_tests::index::embedder;

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
