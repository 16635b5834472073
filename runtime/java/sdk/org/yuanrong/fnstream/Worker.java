package org.yuanrong.fnstream;

import com.google.gson.JsonElement;
import com.google.gson.JsonObject;

import java.io.BufferedInputStream;
import java.io.BufferedOutputStream;
import java.io.DataInputStream;
import java.io.EOFException;
import java.io.FileDescriptor;
import java.io.FileInputStream;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.OutputStream;
import java.io.PrintWriter;
import java.io.StringWriter;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.locks.ReentrantLock;

/**
 * A Java worker: the JVM side of runtime/process/protocol.py, over a socket the frontend made,
 * inherited as the descriptor named by args[0] — never stdin/stdout, which a handler or a child it
 * starts with inheritIO() may use (stdin is /dev/null, stdout the server's stderr). Invocations run on threads of this JVM (instanceConcurrency of them at once);
 * every frame is flushed as soon as it is written, so a stream write reaches the client while the
 * handler runs (a writer thread sends what queued while the socket was busy in one system call,
 * the writes of one invocation in one frame).
 */
public final class Worker {
    final int maxCredits;
    final JsonObject spec;
    final String instanceId;
    volatile Object state;
    private final OutputStream out;
    private final Map<String, Invocation> invocations = new ConcurrentHashMap<>();
    private final Map<String, String> earlyCancels = new ConcurrentHashMap<>();
    private final AtomicInteger running = new AtomicInteger();
    private volatile boolean retiring;
    private Handler handler;
    private Handler preStop;
    private final ExecutorService threads;
    private final AtomicInteger pending = new AtomicInteger(); // queued, not yet on the socket
    private final ReentrantLock writeLock = new ReentrantLock();
    private final BlockingQueue<Out> outbox = new LinkedBlockingQueue<>(OUTBOX_FRAMES);
    private static final int OUTBOX_FRAMES = 65536;
    private static final int BATCH_FRAMES = 1024;
    private static final long FLUSH_BEFORE_EXIT_MS = 2000;

    private Worker(JsonObject hello, OutputStream out) {
        this.spec = hello.getAsJsonObject("spec");
        this.maxCredits = hello.get("credits").getAsInt();
        this.out = out;
        this.instanceId = spec.get("name").getAsString() + "-" + ProcessHandle.current().pid();
        AtomicInteger n = new AtomicInteger();
        this.threads = Executors.newCachedThreadPool(r -> {
            Thread t = new Thread(r, "fnstream-invocation-" + n.incrementAndGet());
            t.setDaemon(true);
            return t;
        });
        Thread writer = new Thread(this::writeLoop, "fnstream-writer");
        writer.setDaemon(true);
        writer.start();
        // A handler's System.exit: what it wrote before still reaches the client.
        Runtime.getRuntime().addShutdownHook(new Thread(this::flush, "fnstream-flush"));
    }

    String name() {
        return spec.get("name").getAsString();
    }

    // -- output ------------------------------------------------------------------------------
    /** One queued frame, or a stream write (merged with the writes of its invocation queued after it). */
    private static final class Out {
        final Wire.Frame frame;
        final String writeId;
        final String payload;
        final CountDownLatch flushed;

        Out(Wire.Frame frame, String writeId, String payload, CountDownLatch flushed) {
            this.frame = frame;
            this.writeId = writeId;
            this.payload = payload;
            this.flushed = flushed;
        }
    }

    /** A frame; straight onto the socket when nothing is queued before it (no hop to the writer). */
    void send(Wire.Frame frame) {
        if (pending.get() == 0 && writeLock.tryLock()) {
            try {
                if (pending.get() == 0) {
                    frame.writeTo(out);
                    out.flush();
                    return;
                }
            } catch (IOException e) {
                halt(0); // the frontend is gone
            } finally {
                writeLock.unlock();
            }
        }
        enqueue(new Out(frame, null, null, null));
    }

    /** A stream write: on the socket as soon as the writer thread gets to it (at once when idle). */
    void sendWrite(String id, String payload) {
        enqueue(new Out(null, id, payload, null));
    }

    private void enqueue(Out out) {
        pending.incrementAndGet();
        try {
            outbox.put(out);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            if (!outbox.offer(out)) { // a cancelled handler's last frame: still sent if there is room
                pending.decrementAndGet();
            }
        }
    }

    /** Waits (bounded) until everything queued so far is on the socket. */
    void flush() {
        CountDownLatch done = new CountDownLatch(1);
        pending.incrementAndGet();
        if (!outbox.offer(new Out(null, null, null, done))) {
            pending.decrementAndGet();
        } else {
            try {
                done.await(FLUSH_BEFORE_EXIT_MS, TimeUnit.MILLISECONDS);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }
    }

    /** The writer thread: what queued while the socket was busy goes out in one system call. */
    private void writeLoop() {
        List<Out> batch = new ArrayList<>();
        List<String> payloads = new ArrayList<>();
        while (true) {
            try {
                batch.add(outbox.take());
            } catch (InterruptedException e) {
                return;
            }
            writeLock.lock();
            outbox.drainTo(batch, BATCH_FRAMES);
            try {
                for (int i = 0; i < batch.size(); i++) {
                    Out o = batch.get(i);
                    if (o.writeId != null) {
                        payloads.add(o.payload);
                        while (i + 1 < batch.size() && o.writeId.equals(batch.get(i + 1).writeId)) {
                            payloads.add(batch.get(++i).payload);
                        }
                        Wire.Frame f = new Wire.Frame(3).key("t").str("write").key("id").str(o.writeId)
                                .key("p").arrayHeader(payloads.size());
                        for (String p : payloads) {
                            f.str(p);
                        }
                        payloads.clear();
                        f.writeTo(out);
                    } else if (o.frame != null) {
                        o.frame.writeTo(out);
                    }
                }
                out.flush();
            } catch (IOException e) {
                halt(0); // the frontend is gone
            } finally {
                pending.addAndGet(-batch.size());
                writeLock.unlock();
            }
            for (Out o : batch) {
                if (o.flushed != null) {
                    o.flushed.countDown();
                }
            }
            batch.clear();
        }
    }

    void log(String logger, int level, String msg, String invocationId) {
        send(new Wire.Frame(5).key("t").str("log").key("name").str(logger).key("level").num(level)
                .key("msg").str(msg).key("invocation_id").str(invocationId));
    }

    private static void halt(int code) {
        System.err.flush();
        Runtime.getRuntime().halt(code);
    }

    static String stackTrace(Throwable t) {
        StringWriter sw = new StringWriter();
        t.printStackTrace(new PrintWriter(sw));
        return sw.toString();
    }

    // -- load and initialise ------------------------------------------------------------------
    private String load() {
        try {
            handler = Handler.resolve(spec.get("handler").getAsString());
            String pre = Wire.optString(spec, "preStop");
            if (pre != null) {
                preStop = Handler.resolveHook("preStop", pre, handler.declaringClass());
            }
            String init = Wire.optString(spec, "initializer");
            if (init != null) {
                Handler.resolveHook("initializer", init, handler.declaringClass());
            }
            return null;
        } catch (Handler.LoadError e) {
            return "function '" + name() + "': " + e.getMessage();
        } catch (Throwable t) {
            return "function '" + name() + "': loading the handler failed: " + t;
        }
    }

    private String initialize() {
        String init = Wire.optString(spec, "initializer");
        if (init == null) {
            return null;
        }
        try {
            Handler.resolveHook("initializer", init, handler.declaringClass()).call(null, new ContextImpl(this, null));
            return null;
        } catch (Throwable t) {
            log("fnstream.worker", FunctionLogger.ERROR, "initializer failed:\n" + stackTrace(t), "");
            return "initializer failed: " + t;
        }
    }

    // -- invocations --------------------------------------------------------------------------
    private void start(JsonObject msg) {
        Invocation inv = new Invocation(msg, this);
        invocations.put(inv.id, inv);
        running.incrementAndGet();
        String early = earlyCancels.remove(inv.id);
        if (early != null) {
            inv.cancel(early);
        }
        threads.execute(() -> run(inv));
    }

    private void run(Invocation inv) {
        inv.bind(Thread.currentThread());
        Object result = null;
        Throwable error = null;
        try {
            if (inv.cancelReason() == null) {
                result = handler.call(inv.event, new ContextImpl(this, inv));
            }
        } catch (Throwable t) {
            error = t;
        } finally {
            inv.bind(null);
            Thread.interrupted(); // a cancel that came late must not leak into the next invocation
        }
        report(inv, result, error);
    }

    private void report(Invocation inv, Object result, Throwable error) {
        inv.end();
        boolean retire = false;
        String name = null;
        String message = null;
        String json = null;
        if (inv.cancelReason() != null) {
            name = "StreamClosedError";
            message = "stream closed: " + inv.cancelReason();
        } else if (error == null) {
            try {
                json = Handler.encode(result);
            } catch (Throwable t) {
                name = "ResultNotSerializableError";
                message = "the handler's result is not JSON-serializable: " + t;
            }
        } else if (error instanceof OutOfMemoryError) {
            name = "MemoryLimitError";
            message = "function '" + name() + "' exceeded its memory limit of " + spec.get("memory").getAsInt()
                    + " MB (" + error + ")";
            retire = true;
        } else {
            log("fnstream.worker", FunctionLogger.ERROR, "invocation " + inv.id + " raised:\n" + stackTrace(error),
                    inv.id);
            name = "JavaHandlerError"; // openYuanrong's Java runtime: 4002, the exception's toString()
            message = error.toString();
            retire = error instanceof VirtualMachineError; // e.g. StackOverflowError: make way for a fresh JVM
        }
        if (retire) {
            retiring = true;
        }
        if (json != null) {
            send(new Wire.Frame(3).key("t").str("result").key("id").str(inv.id).key("json").str(json));
        } else {
            send(new Wire.Frame(5).key("t").str("error").key("id").str(inv.id).key("error").str(name)
                    .key("message").str(message).key("retire").bool(retire));
        }
        invocations.remove(inv.id);
        if (running.decrementAndGet() == 0 && retiring) {
            flushAndHalt(0);
        }
    }

    private void cancel(String id, String reason) {
        Invocation inv = invocations.get(id);
        if (inv == null) {
            if (earlyCancels.size() < 1024) {
                earlyCancels.put(id, reason);
            }
            return;
        }
        inv.cancel(reason);
    }

    private void flushAndHalt(int code) {
        flush();
        halt(code);
    }

    private void stop() {
        String error = null;
        if (preStop != null) {
            double timeout = Math.min(spec.get("timeout").getAsDouble(), 180.0);
            String[] outcome = new String[1];
            Thread t = new Thread(() -> {
                try {
                    preStop.call(null, new ContextImpl(this, null));
                } catch (Throwable e) {
                    log("fnstream.worker", FunctionLogger.ERROR, "preStop failed:\n" + stackTrace(e), "");
                    outcome[0] = "preStop failed: " + e;
                }
            }, "fnstream-prestop");
            t.setDaemon(true);
            t.start();
            try {
                t.join((long) (timeout * 1000));
            } catch (InterruptedException ignored) {
                Thread.currentThread().interrupt();
            }
            error = t.isAlive() ? "preStop did not finish within " + timeout + " s; the worker exits without it"
                    : outcome[0];
        }
        send(new Wire.Frame(2).key("t").str("stopped").key("error").str(error));
        flushAndHalt(0);
    }

    private void serve(DataInputStream in) throws IOException {
        String loadError = load();
        send(new Wire.Frame(3).key("t").str("loaded").key("kind").str(loadError == null ? "sync" : null)
                .key("error").str(loadError));
        String initError = loadError != null ? loadError : initialize();
        send(new Wire.Frame(3).key("t").str("ready").key("pid").num(ProcessHandle.current().pid())
                .key("init_error").str(initError));
        while (true) {
            JsonObject msg = Wire.read(in);
            String t = msg.get("t").getAsString();
            switch (t) {
                case "invoke":
                    if (loadError == null) {
                        start(msg);
                    }
                    break;
                case "credit":
                    Invocation inv = invocations.get(msg.get("id").getAsString());
                    if (inv != null) {
                        inv.credit(msg.get("n").getAsInt());
                    }
                    break;
                case "cancel":
                    cancel(msg.get("id").getAsString(), msg.get("reason").getAsString());
                    break;
                case "stop":
                    Thread s = new Thread(this::stop, "fnstream-stop");
                    s.setDaemon(true);
                    s.start();
                    break;
                default:
                    break; // hello again, stream replies: nothing to do
            }
        }
    }

    /** A worker thread of fnstream's own that dies (an OutOfMemoryError outside a handler) ends the JVM:
     * the pool replaces it, instead of invocations waiting for frames nobody will send. */
    private static void dieWithInternalThreads() {
        Thread.setDefaultUncaughtExceptionHandler((t, e) -> {
            if (t.getName().startsWith("fnstream-") && !t.getName().startsWith("fnstream-invocation-")) {
                System.err.println("fnstream java worker: thread " + t.getName() + " died: " + e);
                halt(70);
            }
            e.printStackTrace();
        });
    }

    /** The inherited socket as a FileDescriptor: its streams are not interruptible (a cancelled handler's
     * thread that sends a frame must not close the channel, as an InterruptibleChannel would). */
    private static FileDescriptor inherited(String fd) throws ReflectiveOperationException {
        FileDescriptor d = new FileDescriptor();
        java.lang.reflect.Field f = FileDescriptor.class.getDeclaredField("fd");
        f.setAccessible(true); // java.base/java.io is opened to us on the command line (runtime/java/pool.py)
        f.setInt(d, Integer.parseInt(fd));
        return d;
    }

    public static void main(String[] args) {
        dieWithInternalThreads();
        FileDescriptor socket;
        try {
            socket = inherited(args[0]);
        } catch (RuntimeException | ReflectiveOperationException e) {
            System.err.println("fnstream java worker: no protocol descriptor (args " + java.util.Arrays.toString(args)
                    + "): " + e);
            halt(2);
            return;
        }
        OutputStream protocol = new BufferedOutputStream(new FileOutputStream(socket), 1 << 16);
        DataInputStream in = new DataInputStream(new BufferedInputStream(new FileInputStream(socket), 1 << 18));
        try {
            JsonObject hello = Wire.read(in);
            JsonElement t = hello.get("t");
            if (t == null || !"hello".equals(t.getAsString())) {
                System.err.println("fnstream java worker: the first frame must be 'hello'");
                halt(2);
            }
            new Worker(hello, protocol).serve(in);
        } catch (EOFException e) {
            halt(0); // the frontend closed the connection
        } catch (IOException e) {
            System.err.println("fnstream java worker: " + e);
            halt(1);
        }
    }
}
