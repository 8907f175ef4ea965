//! Flink's BufferingSink example, on the CheckpointedFunction hooks.

mod common;

use common::*;
use streamstate_state::*;

struct BufferingSink {
    threshold: usize,
    buffered: Vec<(String, u32)>,
    emitted: Vec<(String, u32)>,
    checkpointed: Option<OperatorListState<(String, u32)>>,
    was_restored: bool,
}

impl BufferingSink {
    fn new(threshold: usize) -> Self {
        Self {
            threshold,
            buffered: Vec::new(),
            emitted: Vec::new(),
            checkpointed: None,
            was_restored: false,
        }
    }
    fn invoke(&mut self, v: (String, u32)) {
        self.buffered.push(v);
        if self.buffered.len() >= self.threshold {
            self.emitted.append(&mut self.buffered);
        }
    }
}

impl CheckpointedFunction for BufferingSink {
    fn snapshot_state(&mut self, _ctx: &FunctionSnapshotContext) -> Result<()> {
        let state = self
            .checkpointed
            .as_ref()
            .ok_or_else(|| StateError::Invalid("not initialized".into()))?;
        state.update(&self.buffered)
    }
    fn initialize_state(&mut self, ctx: &FunctionInitializationContext<'_>) -> Result<()> {
        let state = ctx.operator_list_state::<(String, u32)>("buffered-elements")?;
        self.was_restored = ctx.is_restored();
        if ctx.is_restored() {
            self.buffered.extend(state.get()?);
        }
        self.checkpointed = Some(state);
        Ok(())
    }
}

#[test]
fn buffering_sink_gets_its_unflushed_buffer_back_after_restore() {
    for kind in [BackendKind::Hashmap, BackendKind::Rocksdb] {
        let env = Env::new();
        let store = env.single(kind, "a");
        let mut sink = BufferingSink::new(3);
        sink.initialize_state(&FunctionInitializationContext::new(&store))
            .unwrap();
        assert!(!sink.was_restored);
        for i in 0..5 {
            sink.invoke((format!("e{i}"), i));
        }
        assert_eq!(sink.emitted.len(), 3);
        sink.snapshot_state(&FunctionSnapshotContext { checkpoint_id: 1 })
            .unwrap();
        let part = snapshot_to(&store, 1, &env.path("chk"));

        let store2 = env.single(kind, "b");
        store2.restore(&[part]).unwrap();
        let mut sink2 = BufferingSink::new(3);
        sink2
            .initialize_state(&FunctionInitializationContext::new(&store2))
            .unwrap();
        assert!(sink2.was_restored);
        assert_eq!(
            sink2.buffered,
            vec![("e3".to_string(), 3), ("e4".to_string(), 4)]
        );
        sink2.invoke(("e5".into(), 5));
        assert_eq!(sink2.emitted.len(), 3);
    }
}
