package streamstate.bench;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.time.Duration;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.Stores;
import org.apache.kafka.streams.state.WindowStore;
import org.apache.kafka.streams.state.WindowStoreIterator;

/**
 * The benchmark's S workload in Kafka Streams, emitting what streamstate's rules emit
 * (bench/rules.json): per event a running count per key, a dedup of event_id within 10
 * minutes (a window store with that retention, the usual Kafka Streams dedup), and a
 * running sum and count per key and event type. RocksDB stores, exactly_once_v2.
 *
 * Args: bootstrap application.id input output state.dir commit.interval.ms
 */
public final class Workload {
  static final long TTL_MS = Duration.ofMinutes(10).toMillis();
  static final ObjectMapper JSON = new ObjectMapper();

  static final class Rules implements Processor<String, String, String, String> {
    private ProcessorContext<String, String> ctx;
    private KeyValueStore<String, Long> counts;
    private WindowStore<String, Long> seen;
    private KeyValueStore<String, String> sums;

    @Override
    public void init(ProcessorContext<String, String> ctx) {
      this.ctx = ctx;
      counts = ctx.getStateStore("counts");
      seen = ctx.getStateStore("dedup");
      sums = ctx.getStateStore("sums");
    }

    @Override
    public void process(Record<String, String> r) {
      JsonNode e;
      try {
        e = JSON.readTree(r.value());
      } catch (Exception ex) {
        return;
      }
      String key = e.path("user_id").asText();
      long now = System.currentTimeMillis();
      Long c = counts.get(key);
      long n = c == null ? 1 : c + 1;
      counts.put(key, n);
      emit(r, key, JSON.createObjectNode().put("rule_id", "count").put("key", key).put("value", n).put("count", n));

      String id = key + "\u0000" + e.path("event_id").asText();
      boolean dup;
      try (WindowStoreIterator<Long> it = seen.fetch(id, now - TTL_MS, now)) {
        dup = it.hasNext();
      }
      if (!dup) {
        seen.put(id, now, now);
        ObjectNode o = JSON.createObjectNode().put("rule_id", "dedup").put("key", key);
        o.set("value", e);
        emit(r, key, o);
      }

      String type = e.path("type").asText();
      String sk = key + "\u0000" + type;
      String prev = sums.get(sk);
      double sum = e.path("amount").asDouble();
      long m = 1;
      if (prev != null) {
        int at = prev.indexOf(' ');
        m = Long.parseLong(prev.substring(0, at)) + 1;
        sum += Double.parseDouble(prev.substring(at + 1));
      }
      sums.put(sk, m + " " + sum);
      emit(r, key, JSON.createObjectNode().put("rule_id", "sum-" + type).put("key", key).put("value", sum).put("count", m));
    }

    private void emit(Record<String, String> r, String key, ObjectNode o) {
      try {
        ctx.forward(r.withKey(key).withValue(JSON.writeValueAsString(o)));
      } catch (Exception ex) {
        throw new IllegalStateException(ex);
      }
    }
  }

  public static void main(String[] args) throws Exception {
    Properties p = new Properties();
    p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
    p.put(StreamsConfig.APPLICATION_ID_CONFIG, args[1]);
    p.put(StreamsConfig.STATE_DIR_CONFIG, args[4]);
    p.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, args[5]);
    p.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
    p.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, 1);
    p.put(StreamsConfig.consumerPrefix("auto.offset.reset"), "earliest");

    StreamsBuilder b = new StreamsBuilder();
    b.addStateStore(Stores.keyValueStoreBuilder(Stores.persistentKeyValueStore("counts"), Serdes.String(), Serdes.Long()));
    b.addStateStore(Stores.windowStoreBuilder(
        Stores.persistentWindowStore("dedup", Duration.ofMillis(TTL_MS), Duration.ofMillis(TTL_MS), false),
        Serdes.String(), Serdes.Long()));
    b.addStateStore(Stores.keyValueStoreBuilder(Stores.persistentKeyValueStore("sums"), Serdes.String(), Serdes.String()));
    b.stream(args[2], Consumed.with(Serdes.String(), Serdes.String()))
        .process(Rules::new, "counts", "dedup", "sums")
        .to(args[3], Produced.with(Serdes.String(), Serdes.String()));

    KafkaStreams streams = new KafkaStreams(b.build(), p);
    CountDownLatch done = new CountDownLatch(1);
    Runtime.getRuntime().addShutdownHook(new Thread(() -> {
      streams.close(Duration.ofSeconds(30));
      done.countDown();
    }));
    streams.start();
    done.await();
  }
}
