// A client we did not write (docs/design.md §3): Apache Avro's Java library and Kafka's Java client, reading our
// results and writing requests in Avro single-object encoding with the schemas of schemas/, nothing of streamproc.
//   java AvroClient produce <bootstrap> <topic> <schemas dir> <batch> <count>   requests <batch>/j-<i>
//   java AvroClient consume <bootstrap> <topic> <schemas dir> <batch> <count>   prints "<request_id>\t<content>" for
//   each result of the batch, the content base64-encoded (UTF-8) so that a line holds it whole
import java.io.File;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Base64;
import java.util.List;
import java.util.Properties;
import java.util.TreeMap;
import java.util.UUID;

import org.apache.avro.Schema;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.generic.GenericRecordBuilder;
import org.apache.avro.message.BinaryMessageDecoder;
import org.apache.avro.message.BinaryMessageEncoder;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

public final class AvroClient {
    public static void main(String[] args) throws Exception {
        String mode = args[0], bootstrap = args[1], topic = args[2], batch = args[4];
        File schemas = new File(args[3]);
        int count = Integer.parseInt(args[5]);
        if (mode.equals("produce")) {
            produce(bootstrap, topic, new Schema.Parser().parse(new File(schemas, "InferenceRequest.avsc")), batch, count);
        } else {
            consume(bootstrap, topic, new Schema.Parser().parse(new File(schemas, "InferenceResult.avsc")), batch, count);
        }
    }

    static void produce(String bootstrap, String topic, Schema schema, String batch, int count) throws Exception {
        BinaryMessageEncoder<GenericRecord> encoder = new BinaryMessageEncoder<>(GenericData.get(), schema);
        Properties config = new Properties();
        config.put("bootstrap.servers", bootstrap);
        config.put("acks", "all");
        try (KafkaProducer<String, byte[]> producer =
                 new KafkaProducer<>(config, new StringSerializer(), new ByteArraySerializer())) {
            for (int i = 0; i < count; i++) {
                String id = batch + "/j-" + i;
                // the builder fills every field this program does not set with the schema's default, so a field
                // added to the schema later (with its default, as the project's evolution rule says) needs no change
                GenericRecord request = new GenericRecordBuilder(schema)
                    .set("request_id", id)
                    .set("body_json", "{\"model\": \"mock-small\", \"max_tokens\": 256, \"messages\": "
                        + "[{\"role\": \"user\", \"content\": \"Label Java item " + i + ".\"}]}")
                    .set("batch_id", batch)
                    .set("submitted_ms", System.currentTimeMillis())
                    .build();
                ByteBuffer encoded = encoder.encode(request);
                byte[] value = new byte[encoded.remaining()];
                encoded.get(value);
                producer.send(new ProducerRecord<>(topic, id, value)).get();
            }
        }
    }

    static void consume(String bootstrap, String topic, Schema schema, String batch, int count) {
        BinaryMessageDecoder<GenericRecord> decoder = new BinaryMessageDecoder<>(GenericData.get(), schema);
        Properties config = new Properties();
        config.put("bootstrap.servers", bootstrap);
        config.put("group.id", "avro-client-" + UUID.randomUUID());
        config.put("auto.offset.reset", "earliest");
        TreeMap<String, String> found = new TreeMap<>();
        long deadline = System.currentTimeMillis() + 60_000;
        try (KafkaConsumer<String, byte[]> consumer =
                 new KafkaConsumer<>(config, new StringDeserializer(), new ByteArrayDeserializer())) {
            consumer.subscribe(List.of(topic));
            while (found.size() < count && System.currentTimeMillis() < deadline) {
                for (ConsumerRecord<String, byte[]> record : consumer.poll(Duration.ofMillis(500))) {
                    if (record.key() == null || !record.key().startsWith(batch + "/")) {
                        continue;
                    }
                    GenericRecord result;
                    try {
                        result = decoder.decode(record.value());
                    } catch (Exception e) {
                        throw new IllegalStateException("cannot decode the result of " + record.key(), e);
                    }
                    byte[] content = result.get("content").toString().getBytes(StandardCharsets.UTF_8);
                    found.put(result.get("request_id").toString(), Base64.getEncoder().encodeToString(content));
                }
            }
        }
        found.forEach((id, content) -> System.out.println(id + "\t" + content));
    }
}
