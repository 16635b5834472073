package benchjava;

import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import org.yuanrong.services.runtime.Context;
import org.yuanrong.services.runtime.action.Stream;

/** The benchmark workload of bench/functions/bench_handlers.py in Java (target fnstream-java). */
public class Bench {
    private static double num(JsonObject event, String key, double otherwise) {
        return event != null && event.has(key) ? event.get(key).getAsDouble() : otherwise;
    }

    public Object stream(JsonObject event, Context context) throws InterruptedException {
        int count = (int) num(event, "count", 10);
        long first = (long) num(event, "first_delay_ms", 0);
        long delay = (long) num(event, "delay_ms", 0);
        long hold = (long) (num(event, "hold_s", 0) * 1000);
        Stream stream = context.getStream();
        if (first > 0) {
            Thread.sleep(first);
        }
        for (int i = 0; i < count; i++) {
            if (i > 0 && delay > 0) {
                Thread.sleep(delay);
            }
            JsonObject e = new JsonObject();
            e.addProperty("i", i);
            stream.write(e);
        }
        if (hold > 0) {
            Thread.sleep(hold);
        }
        return null;
    }

    public JsonElement echo(JsonElement event, Context context) {
        return event;
    }
}
