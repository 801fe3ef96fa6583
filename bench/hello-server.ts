// The baseline of `npm run bench:reads`: a bare Koa server answering every request with "hello".
import Koa from 'koa';

const app = new Koa();
app.use((ctx) => { ctx.body = 'hello'; });
app.listen(Number(process.env.PORT), '127.0.0.1');
