package streamstate.bench;

import com.fasterxml.jackson.core.JsonParser;
import com.fasterxml.jackson.core.JsonToken;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.nio.ByteBuffer;
import java.time.Duration;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.common.serialization.Serde;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.Suppressed;
import org.apache.kafka.streams.kstream.TimeWindows;
import org.apache.kafka.streams.processor.TimestampExtractor;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.Stores;
import org.apache.kafka.streams.state.WindowStore;
import org.apache.kafka.streams.state.WindowStoreIterator;

/**
 * The benchmark's workloads in Kafka Streams, emitting what streamstate's rules emit
 * (bench/rules*.json). RocksDB stores, exactly_once_v2.
 *
 * <ul>
 *   <li>S: per event a running count per key, a dedup of event_id within 10 minutes (a
 *       window store with that retention, the usual Kafka Streams dedup), and a running
 *       sum and count per key and event type (Processor API);
 *   <li>D: the dedup alone;
 *   <li>W: per key a tumbling 10 s window on the event's `ts` with a 2 s grace (DSL:
 *       windowedBy + aggregate + suppress(untilWindowCloses), so a window is emitted once,
 *       when the task's stream time passes end + 2 s), count/sum/min/max of `amount` as
 *       four records.
 * </ul>
 *
 * Args: bootstrap application.id input output state.dir commit.interval.ms [S|D|W]
 */
public final class Workload {
  static final long TTL_MS = Duration.ofMinutes(10).toMillis();
  static final ObjectMapper JSON = new ObjectMapper();

  /** Workload D: the first sighting of each (key, event_id) within the TTL. */
  static final class Dedup implements Processor<String, String, String, String> {
    private ProcessorContext<String, String> ctx;
    private WindowStore<String, Long> seen;

    @Override
    public void init(ProcessorContext<String, String> ctx) {
      this.ctx = ctx;
      seen = ctx.getStateStore("dedup");
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
      String id = key + "\u0000" + e.path("event_id").asText();
      try (WindowStoreIterator<Long> it = seen.fetch(id, now - TTL_MS, now)) {
        if (it.hasNext()) {
          return;
        }
      }
      seen.put(id, now, now);
      ObjectNode o = JSON.createObjectNode().put("rule_id", "dedup").put("key", key);
      o.set("value", e);
      try {
        ctx.forward(r.withKey(key).withValue(JSON.writeValueAsString(o)));
      } catch (Exception ex) {
        throw new IllegalStateException(ex);
      }
    }
  }

  /** One top-level number field of a JSON object, read with the streaming parser (stops
   * at the field); NaN when absent or not JSON. */
  static double numberField(String json, String name) {
    try (JsonParser p = JSON.getFactory().createParser(json)) {
      if (p.nextToken() != JsonToken.START_OBJECT) {
        return Double.NaN;
      }
      while (p.nextToken() == JsonToken.FIELD_NAME) {
        String f = p.currentName();
        JsonToken t = p.nextToken();
        if (f.equals(name)) {
          return t.isNumeric() ? p.getDoubleValue() : Double.NaN;
        }
        p.skipChildren();
      }
    } catch (Exception ex) {
      return Double.NaN;
    }
    return Double.NaN;
  }

  /** Event time = the event's `ts` (ms); a record without one keeps the Kafka timestamp. */
  static final class EventTime implements TimestampExtractor {
    @Override
    public long extract(ConsumerRecord<Object, Object> r, long partitionTime) {
      double ts = r.value() instanceof String v ? numberField(v, "ts") : Double.NaN;
      return Double.isNaN(ts) ? r.timestamp() : (long) ts;
    }
  }

  /** Workload W's accumulator {count, sum, min, max}, 32 bytes. */
  static final Serde<double[]> STATS = Serdes.serdeFrom(
      (topic, a) -> a == null ? null : ByteBuffer.allocate(32).putDouble(a[0]).putDouble(a[1]).putDouble(a[2]).putDouble(a[3]).array(),
      (topic, b) -> {
        if (b == null) {
          return null;
        }
        ByteBuffer buf = ByteBuffer.wrap(b);
        return new double[] {buf.getDouble(), buf.getDouble(), buf.getDouble(), buf.getDouble()};
      });

  static void window(StreamsBuilder b, String input, String output) {
    b.stream(input, Consumed.with(Serdes.String(), Serdes.String()).withTimestampExtractor(new EventTime()))
        .groupByKey()
        .windowedBy(TimeWindows.ofSizeAndGrace(Duration.ofSeconds(10), Duration.ofSeconds(2)))
        .aggregate(
            () -> new double[] {0, 0, Double.POSITIVE_INFINITY, Double.NEGATIVE_INFINITY},
            (key, value, a) -> {
              double amount = numberField(value, "amount");
              if (Double.isNaN(amount)) {
                return a;
              }
              return new double[] {a[0] + 1, a[1] + amount, Math.min(a[2], amount), Math.max(a[3], amount)};
            },
            // Retention = size + grace: nothing older is ever read again.
            Materialized.<String, double[], WindowStore<Bytes, byte[]>>as("windows")
                .withKeySerde(Serdes.String()).withValueSerde(STATS).withRetention(Duration.ofSeconds(12)))
        .suppress(Suppressed.untilWindowCloses(Suppressed.BufferConfig.unbounded()))
        .toStream()
        .flatMap((wk, a) -> {
          String key = wk.key();
          long n = (long) a[0];
          String[] names = {"count", "sum", "min", "max"};
          KeyValue<String, String>[] out = new KeyValue[4];
          for (int i = 0; i < 4; i++) {
            ObjectNode o = JSON.createObjectNode().put("rule_id", "window-" + names[i]).put("key", key);
            o.putObject("window").put("start", wk.window().start()).put("end", wk.window().end());
            if (i == 0) {
              o.put("value", n);
            } else {
              o.put("value", a[i]);
            }
            o.put("count", n);
            try {
              out[i] = KeyValue.pair(key, JSON.writeValueAsString(o));
            } catch (Exception ex) {
              throw new IllegalStateException(ex);
            }
          }
          return List.of(out);
        })
        .to(output, Produced.with(Serdes.String(), Serdes.String()));
  }

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

    String workload = args.length > 6 ? args[6] : "S";
    StreamsBuilder b = new StreamsBuilder();
    if (workload.equals("W")) {
      window(b, args[2], args[3]);
    } else if (workload.equals("S") || workload.equals("D")) {
      b.addStateStore(Stores.windowStoreBuilder(
          Stores.persistentWindowStore("dedup", Duration.ofMillis(TTL_MS), Duration.ofMillis(TTL_MS), false),
          Serdes.String(), Serdes.Long()));
      if (workload.equals("S")) {
        b.addStateStore(Stores.keyValueStoreBuilder(Stores.persistentKeyValueStore("counts"), Serdes.String(), Serdes.Long()));
        b.addStateStore(Stores.keyValueStoreBuilder(Stores.persistentKeyValueStore("sums"), Serdes.String(), Serdes.String()));
        b.stream(args[2], Consumed.with(Serdes.String(), Serdes.String()))
            .process(Rules::new, "counts", "dedup", "sums")
            .to(args[3], Produced.with(Serdes.String(), Serdes.String()));
      } else {
        b.stream(args[2], Consumed.with(Serdes.String(), Serdes.String()))
            .process(Dedup::new, "dedup")
            .to(args[3], Produced.with(Serdes.String(), Serdes.String()));
      }
    } else {
      System.err.println("unknown workload " + workload + " (S|D|W)");
      System.exit(2);
    }

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
