package streamstate.bench.flink;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import com.fasterxml.jackson.databind.util.RawValue;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.HashMap;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import org.apache.flink.api.common.eventtime.WatermarkStrategy;
import org.apache.flink.api.common.functions.AggregateFunction;
import org.apache.flink.api.common.functions.OpenContext;
import org.apache.flink.api.common.serialization.SerializationSchema;
import org.apache.flink.api.common.state.MapState;
import org.apache.flink.api.common.state.MapStateDescriptor;
import org.apache.flink.api.common.state.StateTtlConfig;
import org.apache.flink.api.common.state.ValueState;
import org.apache.flink.api.common.state.ValueStateDescriptor;
import org.apache.flink.api.common.typeinfo.TypeInformation;
import org.apache.flink.api.common.typeinfo.Types;
import org.apache.flink.api.java.tuple.Tuple2;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.connector.base.DeliveryGuarantee;
import org.apache.flink.connector.kafka.sink.KafkaRecordSerializationSchema;
import org.apache.flink.connector.kafka.sink.KafkaSink;
import org.apache.flink.connector.kafka.sink.TransactionNamingStrategy;
import org.apache.flink.connector.kafka.source.KafkaSource;
import org.apache.flink.connector.kafka.source.enumerator.initializer.OffsetsInitializer;
import org.apache.flink.connector.kafka.source.reader.deserializer.KafkaRecordDeserializationSchema;
import org.apache.flink.core.execution.JobClient;
import org.apache.flink.streaming.api.datastream.DataStream;
import org.apache.flink.streaming.api.datastream.DataStreamUtils;
import org.apache.flink.streaming.api.datastream.KeyedStream;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.streaming.api.functions.KeyedProcessFunction;
import org.apache.flink.streaming.api.functions.windowing.ProcessWindowFunction;
import org.apache.flink.streaming.api.windowing.assigners.TumblingEventTimeWindows;
import org.apache.flink.streaming.api.windowing.windows.TimeWindow;
import org.apache.flink.util.Collector;
import org.apache.kafka.clients.consumer.ConsumerRecord;

/**
 * The benchmark's workloads in Flink's DataStream API, emitting the records streamstate's
 * rules emit (bench/rules*.json), so bench/check.py checks every contender the same way:
 *
 * <ul>
 *   <li>S: per event a running count per key, a dedup of event_id with a 10 min state TTL,
 *       and a running sum and count per key and event type (three outputs per event, two
 *       for a duplicate);
 *   <li>D: the dedup alone (the first sighting of each (key, event_id));
 *   <li>W: per key a tumbling 10 s event-time window (timestamps from the event's `ts`,
 *       watermark = max event time - 2 s) with count, sum, min and max of `amount`,
 *       emitted as four records when the window closes.
 * </ul>
 *
 * One JVM: a local MiniCluster at parallelism 1, RocksDB state with incremental
 * checkpoints on local disk every interval (exactly-once mode), KafkaSource from offset 0
 * (read_committed), KafkaSink with DeliveryGuarantee.EXACTLY_ONCE. The REST API listens on
 * 127.0.0.1 so the harness can read checkpoint durations.
 *
 * <p>Args: workload(S|D|W) bootstrap app input output work_dir interval_ms rest_port
 */
public final class Workload {
  static final Duration TTL = Duration.ofMinutes(10);
  static final long WINDOW_MS = 10_000;
  static final Duration OUT_OF_ORDERNESS = Duration.ofSeconds(2);
  static final ObjectMapper JSON = new ObjectMapper();

  /** A decoded input event; the raw JSON is kept so the dedup output embeds it as is. */
  public static final class Event {
    public String userId;
    public String eventId;
    public String type;
    public double amount;
    public long ts;
    public String raw;

    public Event() {}
  }

  /** An output record: Kafka key and JSON value. */
  public static final class Out {
    public String key;
    public String value;

    public Out() {}

    Out(String key, String value) {
      this.key = key;
      this.value = value;
    }
  }

  /** Decodes in the source, so the rest of the chain handles objects, never bytes. A record
   * that is not a JSON event is skipped (the generator writes none). */
  static final class Decode implements KafkaRecordDeserializationSchema<Event> {
    @Override
    public void deserialize(ConsumerRecord<byte[], byte[]> r, Collector<Event> out) {
      String raw = new String(r.value(), StandardCharsets.UTF_8);
      JsonNode e;
      try {
        e = JSON.readTree(raw);
      } catch (Exception ex) {
        return;
      }
      Event ev = new Event();
      ev.userId = e.path("user_id").asText();
      ev.eventId = e.path("event_id").asText();
      ev.type = e.path("type").asText();
      ev.amount = e.path("amount").asDouble();
      ev.ts = e.path("ts").asLong();
      ev.raw = raw;
      out.collect(ev);
    }

    @Override
    public TypeInformation<Event> getProducedType() {
      return TypeInformation.of(Event.class);
    }
  }

  /** Named classes, not lambdas: the sink's lineage reads their type parameter. */
  static final class KeyBytes implements SerializationSchema<Out> {
    @Override
    public byte[] serialize(Out o) {
      return o.key.getBytes(StandardCharsets.UTF_8);
    }
  }

  static final class ValueBytes implements SerializationSchema<Out> {
    @Override
    public byte[] serialize(Out o) {
      return o.value.getBytes(StandardCharsets.UTF_8);
    }
  }

  static String json(ObjectNode o) {
    try {
      return JSON.writeValueAsString(o);
    } catch (Exception ex) {
      throw new IllegalStateException(ex);
    }
  }

  static Out dedupOutput(Event e) {
    ObjectNode o = JSON.createObjectNode().put("rule_id", "dedup").put("key", e.userId);
    o.putRawValue("value", new RawValue(e.raw));
    return new Out(e.userId, json(o));
  }

  /** The dedup's state: event ids seen per key, each entry expiring 10 min after it was
   * written (processing time, Flink's TTL; expired entries are never returned). */
  static MapStateDescriptor<String, Boolean> seenDescriptor() {
    MapStateDescriptor<String, Boolean> d = new MapStateDescriptor<>("seen", Types.STRING, Types.BOOLEAN);
    d.enableTimeToLive(StateTtlConfig.newBuilder(TTL)
        .setUpdateType(StateTtlConfig.UpdateType.OnCreateAndWrite)
        .setStateVisibility(StateTtlConfig.StateVisibility.NeverReturnExpired)
        .build());
    return d;
  }

  /** Workload S: count, dedup and sum per type, as bench/rules.json. */
  static final class Rules extends KeyedProcessFunction<String, Event, Out> {
    private transient ValueState<Long> count;
    private transient MapState<String, Boolean> seen;
    private transient MapState<String, Tuple2<Long, Double>> sums;

    @Override
    public void open(OpenContext ctx) {
      count = getRuntimeContext().getState(new ValueStateDescriptor<>("count", Types.LONG));
      seen = getRuntimeContext().getMapState(seenDescriptor());
      sums = getRuntimeContext().getMapState(
          new MapStateDescriptor<>("sums", Types.STRING, Types.TUPLE(Types.LONG, Types.DOUBLE)));
    }

    @Override
    public void processElement(Event e, Context ctx, Collector<Out> out) throws Exception {
      Long c = count.value();
      long n = c == null ? 1 : c + 1;
      count.update(n);
      out.collect(new Out(e.userId, json(JSON.createObjectNode()
          .put("rule_id", "count").put("key", e.userId).put("value", n).put("count", n))));

      if (!seen.contains(e.eventId)) {
        seen.put(e.eventId, Boolean.TRUE);
        out.collect(dedupOutput(e));
      }

      Tuple2<Long, Double> prev = sums.get(e.type);
      Tuple2<Long, Double> next = prev == null ? Tuple2.of(1L, e.amount) : Tuple2.of(prev.f0 + 1, prev.f1 + e.amount);
      sums.put(e.type, next);
      out.collect(new Out(e.userId, json(JSON.createObjectNode()
          .put("rule_id", "sum-" + e.type).put("key", e.userId).put("value", next.f1).put("count", next.f0))));
    }
  }

  /** Workload D: the first sighting of each (key, event_id) within the TTL. */
  static final class Dedup extends KeyedProcessFunction<String, Event, Out> {
    private transient MapState<String, Boolean> seen;

    @Override
    public void open(OpenContext ctx) {
      seen = getRuntimeContext().getMapState(seenDescriptor());
    }

    @Override
    public void processElement(Event e, Context ctx, Collector<Out> out) throws Exception {
      if (!seen.contains(e.eventId)) {
        seen.put(e.eventId, Boolean.TRUE);
        out.collect(dedupOutput(e));
      }
    }
  }

  /** Workload W's accumulator: {count, sum, min, max}, one per key and window. */
  static final class Stats implements AggregateFunction<Event, double[], double[]> {
    @Override
    public double[] createAccumulator() {
      return new double[] {0, 0, Double.POSITIVE_INFINITY, Double.NEGATIVE_INFINITY};
    }

    @Override
    public double[] add(Event e, double[] a) {
      a[0] += 1;
      a[1] += e.amount;
      a[2] = Math.min(a[2], e.amount);
      a[3] = Math.max(a[3], e.amount);
      return a;
    }

    @Override
    public double[] getResult(double[] a) {
      return a;
    }

    @Override
    public double[] merge(double[] a, double[] b) {
      return new double[] {a[0] + b[0], a[1] + b[1], Math.min(a[2], b[2]), Math.max(a[3], b[3])};
    }
  }

  /** Emits a closed window as the four records of bench/rules-w.json's rules. */
  static final class EmitWindow extends ProcessWindowFunction<double[], Out, String, TimeWindow> {
    @Override
    public void process(String key, Context ctx, Iterable<double[]> stats, Collector<Out> out) {
      double[] a = stats.iterator().next();
      long n = (long) a[0];
      TimeWindow w = ctx.window();
      String[] names = {"count", "sum", "min", "max"};
      for (int i = 0; i < 4; i++) {
        ObjectNode o = JSON.createObjectNode().put("rule_id", "window-" + names[i]).put("key", key);
        o.putObject("window").put("start", w.getStart()).put("end", w.getEnd());
        if (i == 0) {
          o.put("value", n);
        } else {
          o.put("value", a[i]);
        }
        o.put("count", n);
        out.collect(new Out(key, json(o)));
      }
    }
  }

  public static void main(String[] args) throws Exception {
    if (args.length != 8) {
      System.err.println("usage: Workload S|D|W bootstrap app input output work_dir interval_ms rest_port");
      System.exit(2);
    }
    String workload = args[0], bootstrap = args[1], app = args[2], input = args[3], output = args[4];
    String work = args[5], intervalMs = args[6], restPort = args[7];
    if (!workload.matches("[SDW]")) {
      System.err.println("unknown workload " + workload + " (S|D|W)");
      System.exit(2);
    }

    Map<String, String> c = new HashMap<>();
    c.put("parallelism.default", "1");
    c.put("taskmanager.numberOfTaskSlots", "1");
    c.put("restart-strategy.type", "none"); // a failure ends the run; the harness reports it
    c.put("state.backend.type", "rocksdb");
    c.put("execution.checkpointing.incremental", "true");
    c.put("execution.checkpointing.storage", "filesystem");
    c.put("execution.checkpointing.dir", "file://" + work + "/checkpoints");
    c.put("execution.checkpointing.interval", intervalMs + "ms");
    c.put("execution.checkpointing.mode", "EXACTLY_ONCE");
    c.put("state.backend.rocksdb.localdir", work + "/state");
    c.put("io.tmp.dirs", work + "/state/tmp");
    // RocksDB's block cache and write buffers come out of managed memory (Flink's default
    // for RocksDB); 256 MB for the one slot.
    c.put("state.backend.rocksdb.memory.managed", "true");
    c.put("taskmanager.memory.managed.size", "256m");
    // Chained operators hand objects on without copying them.
    c.put("pipeline.object-reuse", "true");
    // Every type has a Flink serializer (POJOs, tuples, arrays): no Kryo fallback.
    c.put("pipeline.generic-types", "false");
    c.put("rest.address", "127.0.0.1");
    c.put("rest.bind-address", "127.0.0.1");
    c.put("rest.port", restPort);
    c.put("rest.bind-port", restPort);
    Configuration conf = Configuration.fromMap(c);
    StreamExecutionEnvironment env = StreamExecutionEnvironment.createLocalEnvironment(conf);

    KafkaSource<Event> source = KafkaSource.<Event>builder()
        .setBootstrapServers(bootstrap)
        .setTopics(input)
        .setGroupId(app) // offsets are committed to this group at each completed checkpoint
        .setStartingOffsets(OffsetsInitializer.earliest())
        .setDeserializer(new Decode())
        .setProperty("isolation.level", "read_committed")
        .setProperty("partition.discovery.interval.ms", "-1")
        .build();
    WatermarkStrategy<Event> watermarks = workload.equals("W")
        ? WatermarkStrategy.<Event>forBoundedOutOfOrderness(OUT_OF_ORDERNESS).withTimestampAssigner((e, t) -> e.ts)
        : WatermarkStrategy.noWatermarks();
    DataStream<Event> events = env.fromSource(source, watermarks, "input");
    // The input is partitioned by user_id and parallelism is 1, so every key is already
    // where keyBy would send it: reinterpreting keeps source, function and sink in one
    // chain, without a network shuffle and the serialization it costs.
    KeyedStream<Event, String> keyed = DataStreamUtils.reinterpretAsKeyedStream(events, e -> e.userId, Types.STRING);
    TypeInformation<Out> outType = TypeInformation.of(Out.class);
    DataStream<Out> outs = switch (workload) {
      case "S" -> keyed.process(new Rules(), outType).name("rules");
      case "D" -> keyed.process(new Dedup(), outType).name("dedup");
      default -> keyed.window(TumblingEventTimeWindows.of(Duration.ofMillis(WINDOW_MS)))
          .aggregate(new Stats(), new EmitWindow(), TypeInformation.of(double[].class),
              TypeInformation.of(double[].class), outType)
          .name("window");
    };
    outs.sinkTo(KafkaSink.<Out>builder()
        .setBootstrapServers(bootstrap)
        .setRecordSerializer(KafkaRecordSerializationSchema.<Out>builder()
            .setTopic(output) // the builder's schema names its topic, which POOLING needs
            .setKeySerializationSchema(new KeyBytes())
            .setValueSerializationSchema(new ValueBytes())
            .build())
        .setDeliveryGuarantee(DeliveryGuarantee.EXACTLY_ONCE)
        .setTransactionalIdPrefix(app)
        // A small pool of transactional ids reused across checkpoints, instead of a new id
        // (and producer initialisation) per checkpoint.
        .setTransactionNamingStrategy(TransactionNamingStrategy.POOLING)
        // Flink's default (1 h) exceeds the broker's transaction.max.timeout.ms (15 min).
        .setProperty("transaction.timeout.ms", "60000")
        .build()).name("output");

    JobClient job = env.executeAsync("streamstate-bench-" + workload);
    // SIGTERM from the harness: cancel the job, which closes the sink (its open
    // transaction is aborted), so no open transaction holds read_committed readers back.
    Runtime.getRuntime().addShutdownHook(new Thread(() -> {
      try {
        job.cancel().get(30, TimeUnit.SECONDS);
      } catch (Exception ignored) {
        // already finished or failed
      }
    }));
    try {
      job.getJobExecutionResult().get();
    } catch (Exception ex) {
      ex.printStackTrace();
      System.exit(1);
    }
    System.exit(0);
  }
}
