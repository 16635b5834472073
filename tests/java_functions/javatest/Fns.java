package javatest;

import com.google.gson.JsonObject;
import org.yuanrong.services.runtime.Context;
import org.yuanrong.services.runtime.action.Stream;

import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

/** Handlers of the Java tests (tests/runtime/java). */
public class Fns {
    static final AtomicInteger INITS = new AtomicInteger();
    static final CountDownLatch PAIR = new CountDownLatch(2);

    /** A result object: gson serialises its fields. */
    public static class Point {
        int x = 1;
        String label = "p";
        List<Integer> more = List.of(2, 3);
    }

    public void init(Context context) {
        INITS.incrementAndGet();
        context.getLogger().info("initialised " + context.getFunctionName());
    }

    public void badInit(Context context) {
        throw new IllegalStateException("no database");
    }

    /** preStop: leaves a file where the environment says (the test waits for it). */
    public void bye(Context context) throws java.io.IOException {
        Path done = Paths.get(context.getUserData("BYE_FILE"));
        Path tmp = Paths.get(done + ".tmp");
        Files.writeString(tmp, "bye from " + context.getFunctionName());
        Files.move(tmp, done, java.nio.file.StandardCopyOption.ATOMIC_MOVE);
    }

    public JsonObject fields(JsonObject event, Context context) {
        JsonObject out = new JsonObject();
        out.add("event", event);
        out.addProperty("requestId", context.getRequestID());
        out.addProperty("invokeId", context.getInvokeID());
        out.addProperty("functionName", context.getFunctionName());
        out.addProperty("tenant", context.getTenantID());
        out.addProperty("projectId", context.getProjectID());
        out.addProperty("version", context.getVersion());
        out.addProperty("memory", context.getMemorySize());
        out.addProperty("greeting", context.getUserData("GREETING"));
        out.addProperty("missing", context.getUserData("NOPE"));
        out.addProperty("remaining", context.getRemainingTimeInMilliSeconds());
        out.addProperty("timeout", context.getRunningTimeInSeconds());
        out.addProperty("inits", INITS.get());
        out.addProperty("pid", ProcessHandle.current().pid());
        out.addProperty("session", context.getSessionId());
        context.getLogger().info("fields of " + context.getInvokeID());
        return out;
    }

    public String upper(String event, Context context) {
        System.out.println("upper called with " + event.length() + " chars"); // must not corrupt the protocol
        return event.toUpperCase();
    }

    public Point point(Object event, Context context) {
        return new Point();
    }

    /** Writes "one", waits for the file the event names (the test creates it once "one" arrived), writes "two". */
    public String stepped(JsonObject event, Context context) throws Exception {
        Stream stream = context.getStream();
        stream.write("one");
        Path signal = Paths.get(event.get("signal").getAsString());
        Path cancelled = Paths.get(event.get("signal").getAsString() + ".cancelled");
        try {
            while (!Files.exists(signal)) {
                Thread.sleep(5);
            }
        } catch (InterruptedException e) {
            Files.writeString(cancelled, "interrupted");
            throw e;
        }
        JsonObject two = new JsonObject();
        two.addProperty("n", 2);
        stream.write(two);
        stream.write(List.of(3, 4));
        return "done";
    }

    public String many(JsonObject event, Context context) {
        Stream stream = context.getStream();
        int n = event.get("n").getAsInt();
        for (int i = 0; i < n; i++) {
            stream.write("{\"i\":" + i + "}");
        }
        return "ok";
    }

    /** Writes `n` events of `size` chars, recording in the file `progress` how many went out. */
    public int flood(JsonObject event, Context context) throws java.io.IOException {
        int n = event.get("n").getAsInt();
        String pad = "x".repeat(event.get("size").getAsInt());
        Path progress = Paths.get(event.get("progress").getAsString());
        Path tmp = Paths.get(progress + ".tmp");
        Stream stream = context.getStream();
        for (int i = 1; i <= n; i++) {
            stream.write("{\"i\":" + i + ",\"pad\":\"" + pad + "\"}");
            Files.writeString(tmp, Integer.toString(i));
            Files.move(tmp, progress, java.nio.file.StandardCopyOption.ATOMIC_MOVE);
        }
        return n;
    }

    public String boom(JsonObject event, Context context) {
        throw new IllegalStateException("no widgets");
    }

    public String sleep(JsonObject event, Context context) throws InterruptedException {
        Thread.sleep((long) (event.get("seconds").getAsDouble() * 1000));
        return "slept";
    }

    /** Ignores interrupts for `seconds` (a handler that will not stop: its JVM must be replaced). */
    public long stubborn(JsonObject event, Context context) {
        long end = System.nanoTime() + (long) (event.get("seconds").getAsDouble() * 1e9);
        while (System.nanoTime() < end) {
            try {
                Thread.sleep(5);
            } catch (InterruptedException ignored) {
                // on purpose
            }
        }
        return ProcessHandle.current().pid();
    }

    public String exit(JsonObject event, Context context) {
        System.exit(3);
        return "unreachable";
    }

    public int overflow(JsonObject event, Context context) {
        return depth(0);
    }

    private int depth(int n) {
        return depth(n + 1) + 1;
    }

    public int oom(JsonObject event, Context context) {
        List<long[]> hoard = new ArrayList<>();
        while (true) {
            hoard.add(new long[1 << 20]);
        }
    }

    /** Two invocations meet here: each returns only once the other arrived (one JVM, two threads). */
    public JsonObject pair(JsonObject event, Context context) throws InterruptedException {
        PAIR.countDown();
        JsonObject out = new JsonObject();
        out.addProperty("met", PAIR.await(20, TimeUnit.SECONDS));
        out.addProperty("pid", ProcessHandle.current().pid());
        out.addProperty("thread", Thread.currentThread().getName());
        return out;
    }

    /** The JVM's own stdout and stdin, and a child inheriting them: none of them is the protocol. */
    public long stdio(JsonObject event, Context context) throws Exception {
        String how = event.get("how").getAsString();
        if (how.equals("raw")) {
            java.io.FileOutputStream raw = new java.io.FileOutputStream(java.io.FileDescriptor.out);
            raw.write("GARBAGE ON FD1 \u0000\u0001\u0002 hello\n".getBytes());
            raw.flush();
        } else if (how.equals("inherit")) {
            new ProcessBuilder("echo", "child process stdout").inheritIO().start().waitFor();
        } else if (how.equals("stdin")) {
            new ProcessBuilder("timeout", "2", "head", "-c", "1").redirectInput(ProcessBuilder.Redirect.INHERIT)
                    .redirectOutput(ProcessBuilder.Redirect.DISCARD).start().waitFor();
        }
        return ProcessHandle.current().pid();
    }

    /** Overloads: the JsonObject one serves whichever the JVM lists first. */
    public String over(String event, Context context) {
        return "String";
    }

    public String over(JsonObject event, Context context) {
        return "JsonObject";
    }

    public String over(Object event, Context context) {
        return "Object";
    }

    public String revo(Object event, Context context) {
        return "Object";
    }

    public String revo(JsonObject event, Context context) {
        return "JsonObject";
    }

    public String revo(String event, Context context) {
        return "String";
    }

    public String tie(Integer event, Context context) {
        return "Integer";
    }

    public String tie(Long event, Context context) {
        return "Long";
    }

    static final CountDownLatch LATE_GO = new CountDownLatch(1);
    static final java.util.concurrent.CompletableFuture<String> LATE = new java.util.concurrent.CompletableFuture<>();

    /** Leaves a thread behind that writes to this invocation's stream once the next call says it ended. */
    public String late(JsonObject event, Context context) throws Exception {
        if (event.has("check")) {
            LATE_GO.countDown();
            return LATE.get(20, TimeUnit.SECONDS);
        }
        Stream stream = context.getStream();
        Thread t = new Thread(() -> {
            try {
                LATE_GO.await();
                stream.write("late");
                LATE.complete("no exception");
            } catch (org.yuanrong.exception.YRException e) {
                LATE.complete("YRException: " + e.getMessage());
            } catch (Throwable e) {
                LATE.complete(e.toString());
            }
        });
        t.setDaemon(true);
        t.start();
        return "left a writer";
    }

    public static String stat1c(JsonObject event, Context context) {
        return "static";
    }

    public String notAHandler(int x) {
        return "no";
    }
}
